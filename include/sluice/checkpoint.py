"""Plain-file access to Spark's streaming checkpoint layout (no JVM).

The runner pins a stream's query id before Spark starts: it reads ``<checkpoint>/metadata`` or, for a new
checkpoint, writes it. Spark then adopts that id, and the Delta sink uses it as the transaction app id.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

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
