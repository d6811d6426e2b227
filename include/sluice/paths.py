"""Where a stream's data lives: catalog paths are relative to deployment roots that arrive at run time."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from sluice.arguments import option_args
from sluice.errors import CatalogError


def is_absolute(path: str) -> bool:
    """True for ``/abs/path`` and for URIs such as ``s3a://bucket/x`` or ``file:///x``."""
    return path.startswith("/") or "://" in path


def check_relative_path(path: object, *, stream: str, field: str) -> str:
    """Validate a catalog path: a non-empty string that does not climb out of its root."""
    if not isinstance(path, str) or not path.strip():
        raise CatalogError("expected a non-empty path", stream=stream, field=field)
    parts = path.replace("\\", "/").split("/")
    if ".." in parts:
        raise CatalogError(f"path {path!r} must not contain '..'", stream=stream, field=field)
    return path.rstrip("/") if path != "/" else path


def join(root: str, path: str) -> str:
    if is_absolute(path):
        return path
    return posixpath.join(root.rstrip("/"), path) if "://" in root else str(Path(root) / path)


@dataclass(frozen=True)
class Roots:
    """The three deployment roots that relative catalog paths resolve against."""

    landing: str
    lake: str
    checkpoints: str

    @classmethod
    def from_env(cls, base: str | os.PathLike[str] | None = None) -> Roots:
        """Roots from ``SLUICE_LANDING_ROOT``, ``SLUICE_LAKE_ROOT`` and ``SLUICE_CHECKPOINT_ROOT``.

        Each falls back to a folder under ``SLUICE_DATA_ROOT`` (or ``base``, or ``./data``).
        """
        data = str(base or os.environ.get("SLUICE_DATA_ROOT") or Path.cwd() / "data")
        return cls(
            landing=os.environ.get("SLUICE_LANDING_ROOT") or str(Path(data) / "landing"),
            lake=os.environ.get("SLUICE_LAKE_ROOT") or str(Path(data) / "lake"),
            checkpoints=os.environ.get("SLUICE_CHECKPOINT_ROOT") or str(Path(data) / "checkpoints"),
        )

    def as_args(self) -> list[str]:
        return option_args({"landing-root": self.landing, "lake-root": self.lake, "checkpoint-root": self.checkpoints})


def require_local(path: str, *, what: str) -> str:
    """Refuse a URI where Sluice needs a POSIX path (checkpoint metadata pinning and the run lock)."""
    if "://" in path and not path.startswith("file://"):
        raise CatalogError(f"{what} {path!r} must be a local or mounted path: Sluice pins the query id and holds "
                           "the run lock with plain file operations. Mount the storage, or use a local root")
    return path.removeprefix("file://")
