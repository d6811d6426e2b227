"""A file stream's landing zone as Spark's file source sees it: which files it lists, which it has recorded, and
which it will still read. Plain Python, no JVM: the lag checks and the backfill planner share these rules.

Spark's rules, as implemented by ``FileStreamSource`` (Spark 4):

- Listing skips names starting with ``_`` or ``.``; ``pathGlobFilter`` matches the file name; without
  ``recursiveFileLookup`` only partition folders (``key=value``) are descended into.
- A file is new when its path is not in the source log and its modification time is not older than the newest
  recorded file's time minus ``maxFileAge`` (default 7 days). ``latestFirst`` together with
  ``maxFilesPerTrigger`` makes Spark ignore ``maxFileAge``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import quote, unquote, urlsplit

from sluice.catalog import StreamSpec
from sluice.errors import SluiceError
from sluice.paths import Roots, require_local

# Spark's default for the file source's maxFileAge.
DEFAULT_MAX_FILE_AGE = timedelta(days=7)
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800, None: 0.001}


def parse_duration(text: str) -> timedelta:
    """A Spark duration option such as ``7d``, ``36h`` or ``600000`` (milliseconds)."""
    match = _DURATION.match(text)
    if not match:
        raise SluiceError(f"cannot read {text!r} as a duration (e.g. 7d, 36h, 30m)")
    unit = match.group(2).lower() if match.group(2) else None
    return timedelta(seconds=int(match.group(1)) * _DURATION_UNITS[unit])


def spark_file_uri(path: str) -> str:
    """The ``_metadata.file_path`` Spark records for a local file: ``file:`` and the percent-encoded path."""
    return "file:" + quote(path, safe="/-_.~!$&'()*+,;=:@")


def local_file_path(uri: str) -> str:
    return unquote(urlsplit(uri).path) if "://" in uri or uri.startswith("file:") else uri


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
    if options.get("latestFirst", "false").lower() == "true" and stream.trigger.max_files_per_trigger:
        return None
    return parse_duration(options["maxFileAge"]) if "maxFileAge" in options else DEFAULT_MAX_FILE_AGE


def read_horizon(recorded: Mapping[str, int], age: timedelta | None) -> float | None:
    """The oldest modification time (seconds) a file may have for Spark to still read it; None when any will do."""
    if not recorded or age is None:
        return None
    return max(recorded.values()) / 1000 - age.total_seconds()


def iter_source_paths(stream: StreamSpec, roots: Roots) -> Iterator[str]:
    """The paths Spark's file source would list, in a stable order, without a stat per file."""
    root = require_local(stream.source_path(roots), what=f"stream '{stream.name}': source path")
    glob = stream.source.options.get("pathGlobFilter")
    matches = re.compile(fnmatch.translate(glob)).match if glob else None
    recursive = str(stream.source.options.get("recursiveFileLookup", "false")).lower() == "true"
    if not os.path.isdir(root):
        return
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except FileNotFoundError:
            continue
        folders = []
        for entry in entries:
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir():
                if recursive or "=" in entry.name:
                    folders.append(entry.path)
            elif matches is None or matches(entry.name):
                yield entry.path
        pending.extend(reversed(folders))


def stat_file(path: str) -> SourceFile | None:
    """A listed file's size and time; None when it vanished since it was listed."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return SourceFile(path, stat.st_size, stat.st_mtime)


def list_source_files(stream: StreamSpec, roots: Roots) -> list[SourceFile]:
    """Every file Spark's file source would consider, with its size and time."""
    return [found for found in map(stat_file, iter_source_paths(stream, roots)) if found is not None]


def unread_files(stream: StreamSpec, roots: Roots, recorded: Mapping[str, int]) -> list[SourceFile]:
    """The files the stream's next run will read: listed, not in its source log, and inside its maxFileAge
    horizon. Only these are stat'ed, so a landing zone of many recorded files is cheap to check."""
    horizon = read_horizon(recorded, max_file_age(stream))
    unread = []
    for path in iter_source_paths(stream, roots):
        if path in recorded:
            continue
        found = stat_file(path)
        if found is not None and (horizon is None or found.modified >= horizon):
            unread.append(found)
    return unread
