"""A file stream's landing zone as Spark's file source sees it: which files it lists, which it has recorded, and
which it will still read. Plain Python, no JVM: the lag checks and the backfill planner share these rules.

Spark's rules, as implemented by ``FileStreamSource`` (Spark 4):

- Listing skips names starting with ``_`` or ``.``; ``pathGlobFilter`` (a Hadoop glob: ``* ? [..] {a,b}``)
  matches the file name; without ``recursiveFileLookup`` only partition folders (``key=value``) are descended into.
- A file is new when its path (its name, with ``fileNameOnly``) is not in the source log and its modification
  time is not older than the newest recorded file's time minus ``maxFileAge`` (default 7 days). ``latestFirst``
  with ``maxFilesPerTrigger`` or ``maxBytesPerTrigger`` makes Spark ignore ``maxFileAge``.
- A file of a batch that was planned but never committed is read again by the next run (Spark replays the batch).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import quote

from sluice.errors import SluiceError
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader, FileEntry
from sluice.storage.store import folder, is_local
from sluice.times import parse_duration

# Spark's default for the file source's maxFileAge.
DEFAULT_MAX_FILE_AGE = timedelta(days=7)
# What Hadoop's Path.toUri leaves unencoded in a path.
_URI_SAFE = "/-_.~!$&'()*+,;=:@"


def spark_file_uri(path: str) -> str:
    """The ``_metadata.file_path`` Spark records for a file: ``file:`` and the percent-encoded path of a local one;
    an object-store URI with its key percent-encoded the same way (``s3a://bucket/a%20b.json``)."""
    if "://" in path:
        scheme, _, rest = path.partition("://")
        authority, slash, key = rest.partition("/")
        return f"{scheme}://{authority}{slash}{quote(key, safe=_URI_SAFE)}"
    return "file:" + quote(path, safe=_URI_SAFE)


@dataclass(frozen=True)
class SourceFile:
    """A landing-zone file: its local path, size in bytes and modification time (seconds since the epoch)."""

    path: str
    size: int
    modified: float

    @property
    def uri(self) -> str:
        return spark_file_uri(self.path)


def max_file_age(stream: StreamSpec) -> timedelta | None:
    """How far behind the newest recorded file a new file may be and still be read; None when Spark ignores it."""
    options = stream.source.options
    limited = stream.trigger.max_files_per_trigger or stream.trigger.max_bytes_per_trigger
    if options.get("latestFirst", "false").lower() == "true" and limited:
        return None
    return parse_duration(options["maxFileAge"]) if "maxFileAge" in options else DEFAULT_MAX_FILE_AGE


def read_horizon(newest_recorded_ms: int | None, age: timedelta | None) -> float | None:
    """The oldest modification time (seconds) a file may have for Spark to still read it, given the newest recorded
    file's time; None when any will do."""
    if newest_recorded_ms is None or age is None:
        return None
    return newest_recorded_ms / 1000 - age.total_seconds()


def glob_regex(glob: str) -> re.Pattern[str]:
    """A Hadoop glob (``GlobPattern``: ``*``, ``?``, ``[...]``, ``[^...]``, ``{a,b}``, ``\\`` escapes) as a regex."""
    out, depth, index = [], 0, 0
    while index < len(glob):
        char = glob[index]
        if char == "\\" and index + 1 < len(glob):
            index += 1
            out.append(re.escape(glob[index]))
        elif char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = glob.find("]", index + 2)
            if end < 0:
                raise SluiceError(f"pathGlobFilter {glob!r}: '[' without ']'")
            body = glob[index + 1:end]
            out.append("[" + ("^" + body[1:] if body[:1] in "!^" else body).replace("\\", "\\\\") + "]")
            index = end
        elif char == "{":
            depth += 1
            out.append("(?:")
        elif char == "}" and depth:
            depth -= 1
            out.append(")")
        elif char == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(char))
        index += 1
    if depth:
        raise SluiceError(f"pathGlobFilter {glob!r}: '{{' without '}}'")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _listed(stream: StreamSpec, roots: Roots) -> Iterator[tuple[str, bool, SourceFile | None]]:
    """Every path Spark's file source would list, with whether it is a symbolic link, and its size and time when the
    listing told them (an object store's does; a local one is stat-ed later, and only where needed)."""
    location = stream.source_path(roots)
    if is_local(location):
        for path, is_link in _walk_source(stream, location.removeprefix("file://")):
            yield path, is_link, None
        return
    lists = listing_rule(stream)
    base = location.rstrip("/")
    for relative, entry in folder(base).walk():
        if lists(relative):
            yield f"{base}/{relative}", False, SourceFile(f"{base}/{relative}", entry.size, entry.modified)


def listing_rule(stream: StreamSpec) -> Callable[[str], bool]:
    """Whether Spark's file source would list a file at this path below the source folder (``a/b.json``): no
    ``_`` or ``.`` names, partition folders only without ``recursiveFileLookup``, the name matching
    ``pathGlobFilter``. A notified object is held to the same rule (:mod:`sluice.storage.notified`)."""
    glob = stream.source.options.get("pathGlobFilter")
    matches = glob_regex(glob).match if glob else None
    recursive = str(stream.source.options.get("recursiveFileLookup", "false")).lower() == "true"

    def lists(relative: str) -> bool:
        *folders, name = relative.split("/")
        if any(part.startswith(("_", ".")) for part in relative.split("/")):
            return False
        if any(not recursive and "=" not in part for part in folders):
            return False
        return matches is None or bool(matches(name))

    return lists


def _walk_source(stream: StreamSpec, location: str) -> Iterator[tuple[str, bool]]:
    """Every path Spark's file source would list in a local folder, each with whether it is a symbolic link (a
    linked folder is reported, not entered)."""
    root = os.path.abspath(location)
    glob = stream.source.options.get("pathGlobFilter")
    matches = glob_regex(glob).match if glob else None
    recursive = str(stream.source.options.get("recursiveFileLookup", "false")).lower() == "true"
    if not os.path.isdir(root):
        return
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        folders = []
        for entry in entries:
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir():  # follows a link, as Hadoop's listing does
                if recursive or "=" in entry.name:
                    if entry.is_symlink():
                        yield entry.path, True
                    else:
                        folders.append(entry.path)
            elif matches is None or matches(entry.name):
                yield entry.path, entry.is_symlink()
        pending.extend(reversed(folders))


def iter_source_paths(stream: StreamSpec, roots: Roots) -> Iterator[str]:
    """The absolute paths Spark's file source would list, in no particular order, without a stat per file.

    Symbolic links are left out: a link in a landing zone lets whoever can upload there make Spark read any file
    the cluster can (see :func:`source_links`)."""
    return (path for path, is_link, _ in _listed(stream, roots) if not is_link)


def source_links(stream: StreamSpec, roots: Roots) -> list[str]:
    """The symbolic links (to files, or to folders Spark would descend into) among what Spark would list. Spark's
    listing follows them, so a stream must not run while there is one."""
    return sorted(path for path, is_link, _ in _listed(stream, roots) if is_link)


def stat_file(path: str) -> SourceFile | None:
    """A listed file's size and time; None when it vanished since it was listed, or is no longer a plain file."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return SourceFile(path, found.st_size, found.st_mtime) if stat.S_ISREG(found.st_mode) else None


def list_source_files(stream: StreamSpec, roots: Roots) -> list[SourceFile]:
    """Every file Spark's file source would consider, with its size and time, by path (links left out)."""
    return list_landing_zone(stream, roots)[0]


def list_landing_zone(stream: StreamSpec, roots: Roots) -> tuple[list[SourceFile], list[str]]:
    """One walk of the landing zone: the files of :func:`list_source_files` and the links of :func:`source_links`."""
    files: list[SourceFile] = []
    links: list[str] = []
    for path, is_link, known in _listed(stream, roots):
        if is_link:
            links.append(path)
        elif (found := known or stat_file(path)) is not None:
            files.append(found)
    return sorted(files, key=lambda found: found.path), sorted(links)


@dataclass(frozen=True)
class SourceState:
    """What a stream's checkpoint says about its landing zone: the files its source log recorded (by path, or by
    name with ``fileNameOnly``), its last committed batch, and its maxFileAge horizon."""

    recorded: Mapping[str, FileEntry]
    last_commit: int
    horizon: float | None
    file_name_only: bool = False

    @classmethod
    def of(cls, stream: StreamSpec, reader: CheckpointReader) -> SourceState:
        files = reader.file_source_files() if reader.exists else {}
        commits = reader.commit_ids() if reader.exists else []
        by_name = stream.source.options.get("fileNameOnly", "false").lower() == "true"
        recorded = {os.path.basename(path): entry for path, entry in files.items()} if by_name else files
        newest = max((entry.timestamp_ms for entry in files.values()), default=None)
        return cls(recorded, commits[-1] if commits else -1, read_horizon(newest, max_file_age(stream)), by_name)

    def entry(self, path: str) -> FileEntry | None:
        return self.recorded.get(os.path.basename(path) if self.file_name_only else path)

    def will_read(self, found: SourceFile) -> bool:
        """The stream's next run reads the file: it is new and inside the horizon, or its batch never committed."""
        entry = self.entry(found.path)
        if entry is not None:
            return entry.batch_id > self.last_commit
        return self.horizon is None or found.modified >= self.horizon


@dataclass
class Unread:
    """The files the next run reads, and how many listed files it never will (behind the maxFileAge horizon)."""

    files: list[SourceFile]
    behind_horizon: int = 0


def unread_files(stream: StreamSpec, roots: Roots, state: SourceState) -> Unread:
    """The files the stream's next run will read. Files of committed batches are skipped without a stat, so a
    landing zone of many recorded files is cheap to check."""
    # Files read by a committed batch: no run of the stream reads them again.
    done = {key for key, entry in state.recorded.items() if entry.batch_id <= state.last_commit}
    by_name = state.file_name_only
    unread = Unread([])
    for path, is_link, known in _listed(stream, roots):
        if is_link or (os.path.basename(path) if by_name else path) in done:
            continue
        found = known or stat_file(path)
        if found is None:
            continue
        if state.will_read(found):
            unread.files.append(found)
        else:
            unread.behind_horizon += 1
    unread.files.sort(key=lambda found: found.path)
    return unread
