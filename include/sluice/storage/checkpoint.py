"""Access to Spark's streaming checkpoint layout on any store (:mod:`sluice.storage.store`; no JVM).

Layout (Spark 4): ``metadata`` holds ``{"id": <query id>}``; ``offsets/N`` is written before batch N runs (a
version line, a batch-metadata JSON line, one line per source); ``commits/N`` after its sink commits;
``sources/<i>/N[.compact]`` is the file source's log; ``state/`` holds stateful operators' state.

The runner pins a stream's query id before Spark starts: it reads ``<checkpoint>/metadata`` or, for a new
checkpoint, writes it. Spark then adopts that id, and the Delta sink uses it as the transaction app id.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from sluice.errors import SluiceError
from sluice.limits import CHECKPOINT_FILE_MAX_BYTES, MAX_BATCH_ID, SOURCE_LOG_MAX_BYTES
from sluice.storage.store import AlreadyExists, Folder, NotReadable, folder


class CheckpointError(SluiceError):
    """The checkpoint is in a state a run must not start from."""


Location = str | os.PathLike[str] | Folder


def _folder(checkpoint: Location) -> Folder:
    return checkpoint if isinstance(checkpoint, Folder) else folder(checkpoint)


def read_query_id(checkpoint: Location) -> str | None:
    """The query id recorded in ``metadata``, or None when the checkpoint has none yet."""
    root = _folder(checkpoint)
    metadata = root.where("metadata")
    try:
        text = root.read_bounded_text("metadata", CHECKPOINT_FILE_MAX_BYTES).strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except (OSError, NotReadable) as exc:
        raise _unreadable(f"checkpoint metadata {metadata}", exc) from None
    try:
        query_id = json.loads(text.splitlines()[0])["id"] if text else None
    except (json.JSONDecodeError, KeyError, TypeError, IndexError):
        query_id = None
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointError(f"checkpoint metadata {metadata} is corrupt ({text[:80]!r}); restore it from a backup "
                              "or re-pin the query id recorded in the sink")
    return query_id


def ensure_query_id(checkpoint: Location) -> str:
    """The checkpoint's query id, creating ``metadata`` with a new id for a new checkpoint.

    A checkpoint that has offsets but no metadata is refused: Spark would silently start a new query id, and the
    sink would no longer recognise the batches this checkpoint replays.
    """
    root = _folder(checkpoint)
    existing = read_query_id(root)
    if existing:
        return existing
    if root.child("offsets").entries():
        raise CheckpointError(f"checkpoint {root} has offsets but no metadata file: its query id is lost. Restore "
                              "metadata from a backup or re-pin it to the id recorded in the sink before running")
    query_id = str(uuid.uuid4())
    try:
        # Create-if-absent: of two runs pinning a new checkpoint at once, one id wins and both use it.
        root.create("metadata", (json.dumps({"id": query_id}) + "\n").encode("utf-8"))
    except AlreadyExists:
        return read_query_id(root) or query_id
    return query_id


def local_file_path(uri: str) -> str:
    """A file as Spark records it (in the source log, in ``_metadata.file_path``), as Sluice lists it: the local path
    of a ``file:`` URI (``file:///...`` unescaped is the common case, without a parse), an object-store URI
    (``s3a://bucket/key``) as it is but unescaped, and anything without a scheme as it is."""
    if uri.startswith("file:///") and "%" not in uri and "?" not in uri and "#" not in uri:
        return uri[7:]
    parts = urlsplit(uri)
    if not parts.scheme:
        return uri
    if parts.scheme != "file":
        return unquote(uri)
    return unquote(parts.path)


# JSON that parses, but not as Python reads a number of more than 4,300 digits or arrays nested 1,000 deep.
_NOT_SPARKS_JSON = "not JSON that Spark writes (a number too long, or values nested too deeply)"


def _unreadable(path: str, exc: OSError | NotReadable) -> CheckpointError:
    """A file of the checkpoint that cannot be read, as one line that names it."""
    return CheckpointError(f"{path}: {exc.reason if isinstance(exc, NotReadable) else f'cannot read ({exc})'}")


def _log_entries(log: Folder, name: str) -> list[dict[str, Any]]:
    """The JSON entries of a Spark metadata log file (its first line is the version), parsed in one call: a
    compacted source log holds every file the stream ever read."""
    return _parsed(log.where(name), _log_lines(log, name)[1:])


def _log_lines(log: Folder, name: str) -> list[str]:
    """The lines of a Spark metadata log file, its version line first, without blank ones."""
    try:
        return [line for line in log.read_bounded_text(name, SOURCE_LOG_MAX_BYTES).split("\n") if line.strip()]
    except (OSError, NotReadable) as exc:
        raise _unreadable(log.where(name), exc) from None


def _parsed(path: str, lines: list[str]) -> list[dict[str, Any]]:
    """Entry lines of a Spark metadata log file as JSON objects, parsed in one call; ``path`` names the file."""
    try:
        entries = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        for number, line in enumerate(lines, start=2):
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{path}: line {number} is not JSON ({exc.msg})") from exc
        raise CheckpointError(f"{path}: the entries are not JSON objects") from None
    except (ValueError, RecursionError):
        raise CheckpointError(f"{path}: {_NOT_SPARKS_JSON}") from None
    if not all(isinstance(entry, dict) for entry in entries):
        raise CheckpointError(f"{path}: the entries are not JSON objects")
    return entries


# ASCII digits only (``\d`` takes any script's), and no more than a long holds: a name of a million digits must
# cost nothing to skip.
_LOG_FILE = re.compile(r"(\.)?([0-9]{1,19})(\.compact)?(\.crc)?")


def batch_id(text: str) -> int | None:
    """A batch id written as Spark writes one (plain ASCII decimal, at most 2**63-1); None for anything else."""
    if not 0 < len(text) <= 19 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= MAX_BATCH_ID else None


def log_file_batch(name: str, *, with_checksums: bool = False) -> int | None:
    """The batch id of a Spark metadata log file name (``N``, ``N.compact``; ``.N.crc`` and ``.N.compact.crc``
    too when ``with_checksums``); None for anything else (Spark's ``.N.<uuid>.tmp`` files included)."""
    match = _LOG_FILE.fullmatch(name)
    if match is None or bool(match.group(1)) != bool(match.group(4)):
        return None
    if match.group(4) and not with_checksums:
        return None
    return batch_id(match.group(2))


def _odd_name(name: str) -> bool:
    """A name that reads as a batch number but is none Spark writes (past 2**63-1, other scripts' digits): Spark
    skips it, and so does Sluice, but someone put it there."""
    number = name.removesuffix(".compact")
    return number.isdigit() and batch_id(number) is None


def _batch_ids(log: Folder) -> list[int]:
    """Batch ids of a Spark metadata log folder (``offsets``, ``commits``): plain decimal names only.

    ``.crc`` files, Spark's ``.<id>.<uuid>.tmp`` files and anything else are ignored.
    """
    return sorted(found for entry in log.entries()
                  if not entry.is_dir and (found := batch_id(entry.name)) is not None)


def gaps(ids: list[int], *, limit: int = 100) -> tuple[list[int], int]:
    """The ids missing between the first and the last of sorted ``ids``: the first ``limit`` of them, and how many
    there are. From neighbours, never a range over the span: two files named 0 and 2**62 must cost nothing."""
    missing: list[int] = []
    count = 0
    for before, after in itertools.pairwise(ids):
        if after - before > 1:
            count += after - before - 1
            missing.extend(range(before + 1, min(after, before + 1 + limit - len(missing))))
    return missing, count


@dataclass(frozen=True)
class OffsetEntry:
    """A parsed ``offsets/N`` file: the batch metadata line and one offset per source (None for a source that
    had no data yet, written by Spark as ``-``)."""

    batch_id: int
    metadata: dict[str, Any]
    sources: list[Any]


class FileEntry(NamedTuple):
    """A file source log entry: the file's modification time (ms) and the batch that planned it. A tuple: a compacted
    log holds every file the stream ever read, and a tuple is the cheapest record to build 100,000 of."""

    timestamp_ms: int
    batch_id: int


class CheckpointReader:
    """Reads a streaming checkpoint's layout on any store: newest entries and listings, never the history."""

    def __init__(self, root: Location) -> None:
        self.folder = _folder(root)

    def where(self, *names: str) -> str:
        """How a message names a file of the checkpoint."""
        return "/".join([self.folder.uri.rstrip("/"), *names])

    @property
    def exists(self) -> bool:
        return self.folder.is_dir()

    def offset_ids(self) -> list[int]:
        return _batch_ids(self.folder.child("offsets"))

    def commit_ids(self) -> list[int]:
        return _batch_ids(self.folder.child("commits"))

    def odd_log_files(self) -> list[str]:
        """The files of ``offsets/``, ``commits/`` and ``sources/<i>/`` whose names read as batch numbers Spark
        never writes (see :func:`_odd_name`), as messages name them."""
        logs = [("offsets",), ("commits",)] + [("sources", entry.name) for entry in self.folder.child("sources")
                                               .entries() if entry.is_dir]
        return [self.where(*log, entry.name) for log in logs for entry in self.folder.child(*log).entries()
                if _odd_name(entry.name)]

    def committed_source_offset(self, source: int = 0) -> Any:
        """The offset of ``source`` in ``offsets/<last committed batch>``: where the next run starts. None when
        nothing was committed."""
        commits = self.commit_ids()
        if not commits:
            return None
        entry = self.read_offsets(commits[-1])
        return entry.sources[source] if source < len(entry.sources) else None

    def read_offsets(self, batch_id: int) -> OffsetEntry:
        """Parse ``offsets/<batch_id>``; a torn or unreadable file raises :class:`CheckpointError`."""
        path = self.where("offsets", str(batch_id))
        try:
            text = self.folder.child("offsets").read_bounded_text(str(batch_id), CHECKPOINT_FILE_MAX_BYTES)
            lines = text.split("\n")
        except (OSError, NotReadable) as exc:
            raise _unreadable(path, exc) from None
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise CheckpointError(f"{path}: expected a version line and a metadata line, found {len(lines)} line(s)")
        try:
            metadata = json.loads(lines[1])
            sources = [None if line.strip() == "-" else json.loads(line) for line in lines[2:]]
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: line {exc.lineno + 1 if exc.lineno else '?'} is not JSON ({exc.msg})") \
                from exc
        except (ValueError, RecursionError):
            raise CheckpointError(f"{path}: {_NOT_SPARKS_JSON}") from None
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{path}: the metadata line is not a JSON object")
        return OffsetEntry(batch_id, metadata, sources)

    def read_commit(self, batch_id: int) -> dict[str, Any]:
        path = self.where("commits", str(batch_id))
        try:
            lines = self.folder.child("commits").read_bounded_text(str(batch_id), CHECKPOINT_FILE_MAX_BYTES).split(
                "\n")
            return json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
        except (OSError, NotReadable) as exc:
            raise _unreadable(path, exc) from None
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: cannot parse ({exc})") from None

    def commit_time(self, batch_id: int) -> float:
        """When ``commits/<batch_id>`` was written (seconds since the epoch)."""
        entry = self.folder.child("commits").stat(str(batch_id))
        if entry is None:
            raise CheckpointError(f"{self.where('commits', str(batch_id))}: not there")
        return entry.modified

    def file_source_log(self, source: int = 0) -> list[int]:
        """Batch ids present in the file source log (``N`` and ``N.compact``)."""
        return sorted(batch for entry in self.folder.child("sources", str(source)).entries()
                      if (batch := log_file_batch(entry.name)) is not None)

    def missing_file_source_batches(self, source: int, through: int) -> list[int]:
        """The first 100 batches of file source ``source``'s log that Spark needs to resume at log offset ``through``
        and that are not there: the newest ``.compact`` file at or before it (which holds every earlier batch) and each
        batch after that, or every batch from 0 when nothing was compacted. Spark fails such a run with
        "batch N doesn't exist"."""
        names = {entry.name for entry in self.folder.child("sources", str(source)).entries()}
        present = {batch for name in names if (batch := log_file_batch(name)) is not None}
        compacts = [batch for batch in present if batch <= through and f"{batch}.compact" in names]
        first = max(compacts, default=0)
        # Between first and through by neighbours: ``through`` comes from a file, and may be 2**63-1.
        missing, _ = gaps([first - 1, *sorted(batch for batch in present if first <= batch <= through), through + 1])
        return missing

    def file_source_entries(self, source: int = 0) -> dict[str, int]:
        """Every file the file source has recorded, as local path -> modification time (ms)."""
        return {path: entry.timestamp_ms for path, entry in self.file_source_files(source).items()}

    def file_source_files(self, source: int = 0) -> dict[str, FileEntry]:
        """Every file the file source has recorded, by local path, with its time and the batch that planned it: the
        newest ``.compact`` file (which holds every entry before it) plus the delta files after it."""
        log = self.folder.child("sources", str(source))
        present = {entry.name for entry in log.entries()}
        ids = sorted(batch for name in present if (batch := log_file_batch(name)) is not None)
        compacts = [i for i in ids if f"{i}.compact" in present]
        start = max(compacts, default=None)
        names = ([f"{start}.compact"] if start is not None else []) + [
            str(i) for i in ids if start is None or i > start]
        files: dict[str, FileEntry] = {}
        for name in names:
            files.update((local_file_path(entry["path"]), FileEntry(entry["timestamp"], entry.get("batchId", -1)))
                         for entry in _log_entries(log, name))
        return files

    def prune_file_source_log(self, *, through_batch: int, before_ms: int, gone: Callable[[str], bool],
                              source: int = 0) -> int:
        """Rewrite the newest ``.compact`` file of file source ``source``'s log without the entries Spark drops anyway
        when a query starts, and whose files are gone: entries of batches at or below ``through_batch`` (committed,
        and all their files done) whose recorded time is before ``before_ms`` and for whose local path ``gone``
        holds. The number of entries dropped.

        Spark's file source reads every entry of its log into its map of seen files when a query starts, then purges
        those older than its newest entry's time less ``maxFileAge`` (``SeenFilesMap.purge``): behind that horizon
        a file is not read whether it was seen or not. So the caller passes a ``before_ms`` at or behind that horizon,
        and Spark's choices are the same without the entries, while the log Spark (and Sluice) read at each start
        stays the size of the horizon instead of the stream's whole history. Spark compacts every tenth batch from
        the previous ``.compact`` file, so the pruned entries stay out.

        Run it with the stream's lock held (no query is running). The file is replaced whole: the new text is
        written beside it and renamed over it (one PUT on an object store). Its Hadoop checksum (``.<name>.crc``,
        on a disk) is deleted first: a missing checksum is not verified, a stale one fails the next read."""
        log = self.folder.child("sources", str(source))
        compacts = [batch for entry in log.entries()
                    if entry.name.endswith(".compact") and (batch := log_file_batch(entry.name)) is not None]
        if not compacts:
            return 0
        name = f"{max(compacts)}.compact"
        lines = _log_lines(log, name)
        if not lines or not lines[0].startswith("v"):
            raise CheckpointError(f"{log.where(name)}: expected a version line first")
        kept = [lines[0]] + [line for line, entry in zip(lines[1:], _parsed(log.where(name), lines[1:]), strict=True)
                             if not (entry.get("batchId", through_batch + 1) <= through_batch
                                     and entry["timestamp"] < before_ms and gone(local_file_path(entry["path"])))]
        dropped = len(lines) - len(kept)
        if dropped:
            log.delete(f".{name}.crc")
            log.write_bytes(name, "\n".join(kept).encode("utf-8"))
        return dropped

    def has_state(self) -> bool:
        return self.folder.child("state").is_dir()

    def state_bytes(self) -> int:
        return self.folder.child("state").total_bytes()
