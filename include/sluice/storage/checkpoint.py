"""Plain-file access to Spark's streaming checkpoint layout (no JVM).

Layout (Spark 4): ``metadata`` holds ``{"id": <query id>}``; ``offsets/N`` is written before batch N runs (a
version line, a batch-metadata JSON line, one line per source); ``commits/N`` after its sink commits;
``sources/<i>/N[.compact]`` is the file source's log; ``state/`` holds stateful operators' state.

The runner pins a stream's query id before Spark starts: it reads ``<checkpoint>/metadata`` or, for a new
checkpoint, writes it. Spark then adopts that id, and the Delta sink uses it as the transaction app id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from sluice.errors import SluiceError


class CheckpointError(SluiceError):
    """The checkpoint is in a state a run must not start from."""


def read_query_id(checkpoint: str | os.PathLike[str]) -> str | None:
    """The query id recorded in ``metadata``, or None when the checkpoint has none yet."""
    metadata = Path(checkpoint) / "metadata"
    if not metadata.exists():
        return None
    text = metadata.read_text(encoding="utf-8").strip()
    try:
        query_id = json.loads(text.splitlines()[0])["id"] if text else None
    except (json.JSONDecodeError, KeyError, TypeError, IndexError):
        query_id = None
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointError(f"checkpoint metadata {metadata} is corrupt ({text[:80]!r}); restore it from a backup "
                              "or re-pin the query id recorded in the sink")
    return query_id


def ensure_query_id(checkpoint: str | os.PathLike[str]) -> str:
    """The checkpoint's query id, creating ``metadata`` with a new id for a new checkpoint.

    A checkpoint that has offsets but no metadata is refused: Spark would silently start a new query id, and the
    sink would no longer recognise the batches this checkpoint replays.
    """
    existing = read_query_id(checkpoint)
    if existing:
        return existing
    root = Path(checkpoint)
    offsets = root / "offsets"
    if offsets.is_dir() and any(offsets.iterdir()):
        raise CheckpointError(f"checkpoint {root} has offsets but no metadata file: its query id is lost. Restore "
                              "metadata from a backup or re-pin it to the id recorded in the sink before running")
    root.mkdir(parents=True, exist_ok=True)
    query_id = str(uuid.uuid4())
    temporary = root / f".metadata.{query_id}.tmp"
    temporary.write_text(json.dumps({"id": query_id}) + "\n", encoding="utf-8")
    os.replace(temporary, root / "metadata")
    return query_id


def _local_path(uri: str) -> str:
    """The local path of a ``file:///...`` URI from the source log; the common unescaped case without a parse."""
    if uri.startswith("file:///") and "%" not in uri and "?" not in uri and "#" not in uri:
        return uri[7:]
    return unquote(urlsplit(uri).path)


def _log_entries(path: Path) -> list[dict[str, Any]]:
    """The JSON entries of a Spark metadata log file (its first line is the version), parsed in one call: a
    compacted source log holds every file the stream ever read."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8").split("\n")[1:] if line.strip()]
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from exc
    try:
        entries = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        for number, line in enumerate(lines, start=2):
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{path}: line {number} is not JSON ({exc.msg})") from exc
        raise CheckpointError(f"{path}: the entries are not JSON objects") from None
    if not all(isinstance(entry, dict) for entry in entries):
        raise CheckpointError(f"{path}: the entries are not JSON objects")
    return entries


_LOG_FILE = re.compile(r"^(\.)?(\d+)(\.compact)?(\.crc)?$")


def log_file_batch(name: str, *, with_checksums: bool = False) -> int | None:
    """The batch id of a Spark metadata log file name (``N``, ``N.compact``; ``.N.crc`` and ``.N.compact.crc``
    too when ``with_checksums``); None for anything else (Spark's ``.N.<uuid>.tmp`` files included)."""
    match = _LOG_FILE.match(name)
    if match is None or bool(match.group(1)) != bool(match.group(4)):
        return None
    if match.group(4) and not with_checksums:
        return None
    return int(match.group(2))


def _batch_ids(folder: Path) -> list[int]:
    """Batch ids of a Spark metadata log folder (``offsets``, ``commits``): numeric names only.

    ``.crc`` files, Spark's ``.<id>.<uuid>.tmp`` files and anything else are ignored.
    """
    if not folder.is_dir():
        return []
    return sorted(int(entry.name) for entry in os.scandir(folder) if entry.name.isdigit() and entry.is_file())


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
    """Reads a streaming checkpoint's layout from plain files: newest entries and listings, never the history."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def exists(self) -> bool:
        return self.root.is_dir()

    def offset_ids(self) -> list[int]:
        return _batch_ids(self.root / "offsets")

    def commit_ids(self) -> list[int]:
        return _batch_ids(self.root / "commits")

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
        path = self.root / "offsets" / str(batch_id)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot read ({exc})") from exc
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
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{path}: the metadata line is not a JSON object")
        return OffsetEntry(batch_id, metadata, sources)

    def read_commit(self, batch_id: int) -> dict[str, Any]:
        path = self.root / "commits" / str(batch_id)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
            return json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot parse ({exc})") from exc

    def commit_time(self, batch_id: int) -> float:
        """When ``commits/<batch_id>`` was written (seconds since the epoch)."""
        return (self.root / "commits" / str(batch_id)).stat().st_mtime

    def file_source_log(self, source: int = 0) -> list[int]:
        """Batch ids present in the file source log (``N`` and ``N.compact``)."""
        folder = self.root / "sources" / str(source)
        if not folder.is_dir():
            return []
        return sorted(batch for entry in os.scandir(folder) if (batch := log_file_batch(entry.name)) is not None)

    def missing_file_source_batches(self, source: int, through: int) -> list[int]:
        """The batches of file source ``source``'s log that Spark needs to resume at log offset ``through`` and that
        are not there: the newest ``.compact`` file at or before it (which holds every earlier batch) and each batch
        after that, or every batch from 0 when nothing was compacted. Spark fails such a run with
        "batch N doesn't exist"."""
        folder = self.root / "sources" / str(source)
        present = set(self.file_source_log(source))
        compacts = [batch for batch in present if batch <= through and (folder / f"{batch}.compact").is_file()]
        first = max(compacts, default=0)
        return [batch for batch in range(first, through + 1) if batch not in present]

    def file_source_entries(self, source: int = 0) -> dict[str, int]:
        """Every file the file source has recorded, as local path -> modification time (ms)."""
        return {path: entry.timestamp_ms for path, entry in self.file_source_files(source).items()}

    def file_source_files(self, source: int = 0) -> dict[str, FileEntry]:
        """Every file the file source has recorded, by local path, with its time and the batch that planned it: the
        newest ``.compact`` file (which holds every entry before it) plus the delta files after it."""
        folder = self.root / "sources" / str(source)
        ids = self.file_source_log(source)
        compacts = [i for i in ids if (folder / f"{i}.compact").exists()]
        start = max(compacts, default=None)
        names = ([f"{start}.compact"] if start is not None else []) + [
            str(i) for i in ids if start is None or i > start]
        files: dict[str, FileEntry] = {}
        for name in names:
            files.update((_local_path(entry["path"]), FileEntry(entry["timestamp"], entry.get("batchId", -1)))
                         for entry in _log_entries(folder / name))
        return files

    def has_state(self) -> bool:
        return (self.root / "state").is_dir()

    def state_bytes(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root / "state"):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(folder, name)).st_size
        return total
