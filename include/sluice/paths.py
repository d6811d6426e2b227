"""Where a stream's data lives: catalog paths are relative to deployment roots that arrive at run time."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from sluice.arguments import option_args
from sluice.errors import CatalogError

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(.*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def is_absolute(path: str) -> bool:
    """True for ``/abs/path`` and for URIs such as ``s3a://bucket/x`` or ``file:///x``."""
    return path.startswith("/") or "://" in path


def check_relative_path(path: object, *, stream: str, field: str) -> str:
    """Validate a catalog path and return it normalized (``a//b/./c/`` is ``a/b/c``).

    A relative path lives under its root: it must name a folder there, not the root itself (``.``), and must not
    climb out of it. An absolute path or a URI is used as it is, so it must not name the root of its file system or
    bucket.
    """
    if not isinstance(path, str) or not path.strip():
        raise CatalogError("expected a non-empty path", stream=stream, field=field)
    if _CONTROL.search(path):
        raise CatalogError(f"path {path!r} must not contain control characters", stream=stream, field=field)
    if ".." in path.replace("\\", "/").split("/"):
        raise CatalogError(f"path {path!r} must not contain '..'", stream=stream, field=field)
    if "://" in path and not _URI.match(path):
        raise CatalogError(f"path {path!r} is neither a relative path nor a URI (scheme://authority/path)",
                           stream=stream, field=field)
    normalized = normalize_path(path)
    if not path_key(normalized)[1]:
        where = "the root of its file system or bucket" if is_absolute(path) else "its root itself"
        raise CatalogError(f"path {path!r} names {where}; name a folder under it", stream=stream, field=field)
    return normalized


def _split(path: str) -> tuple[str, list[str]]:
    """A path's prefix (``""`` relative, ``"/"`` local, ``"scheme://authority/"`` for a URI) and its components,
    without empty and ``.`` ones."""
    uri = _URI.match(path)
    if uri is not None:
        prefix, rest = f"{uri.group(1)}://{uri.group(2)}/", uri.group(3)
    elif path.startswith("/"):
        prefix, rest = "/", path
    else:
        prefix, rest = "", path
    return prefix, [part for part in rest.split("/") if part not in ("", ".")]


def normalize_path(path: str) -> str:
    """``path`` without empty or ``.`` components and without a trailing slash, its URI scheme kept."""
    prefix, parts = _split(path)
    return prefix + "/".join(parts) if parts or prefix else "."


def path_key(path: str) -> tuple[str, tuple[str, ...]]:
    """What two paths are compared by: the storage they live in (``""`` for a path relative to a root, ``"/"`` for a
    local one, ``file://`` included, ``scheme://authority`` otherwise) and their components. Case is folded: two
    paths that differ only in case are one folder on a case-insensitive store (macOS, some mounts)."""
    prefix, parts = _split(path)
    storage = "/" if prefix.casefold() == "file:///" else prefix.rstrip("/") or prefix
    # s3a:// is Hadoop's name for the same buckets as s3://.
    storage = re.sub(r"^s3a://", "s3://", storage, flags=re.IGNORECASE)
    return storage.casefold(), tuple(part.casefold() for part in parts)


def resolved_key(root: str, path: str) -> tuple[str, tuple[str, ...]]:
    """:func:`path_key` of ``path`` resolved against ``root``; a local path with its links resolved, as the file
    system will see it (``realpath`` needs no existing file)."""
    full = join(root, path)
    uri = _URI.match(full)
    if uri is None or uri.group(1).casefold() == "file":
        return path_key(os.path.realpath(full if uri is None else uri.group(3) or "/"))
    return path_key(full)


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
