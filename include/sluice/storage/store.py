"""One storage layer for everything Sluice reads or writes outside Spark: a :class:`Folder` on a local disk or under
an object-store prefix (``s3://``/``s3a://``, ``gs://``, ``abfss://``), with the same calls on both.

Object stores go through obstore (Rust's ``object_store``, the crate delta-rs writes with): listings are paginated
by the store and read no object, and it has the conditional writes a lock needs (create-if-absent, replace-if-
unchanged) on S3 (``If-None-Match``/``If-Match``), GCS (generation preconditions) and Azure (ETag conditions).

Credentials never come from the catalog or a param. A store reads them from the environment, as its SDK does
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``;
``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``...; ``GOOGLE_SERVICE_ACCOUNT``...), which the operators fill from an
Airflow connection (:func:`sluice.connections.storage.storage_environment`), never in a log, an XCom or a
summary.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sluice.errors import SluiceError
from sluice.storage import credentials

# Schemes Sluice reads and writes, and the one obstore knows them by.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "abfss": "abfss", "az": "az", "file": "file"}
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)/?(.*)$")


class StoreError(SluiceError):
    """A store refused or failed an operation."""


class AlreadyExists(StoreError):
    """A create-if-absent found the object there."""


class Changed(StoreError):
    """A replace-if-unchanged found another version of the object."""


class NoConditionalWrites(StoreError):
    """The store cannot create-if-absent or replace-if-unchanged, so it cannot hold a lock safely."""


class NotReadable(StoreError):
    """A bounded read found something other than a regular file of at most its limit (a link, a FIFO, a device, a
    file too large); the message names the file, ``reason`` says what it is."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    """A file or a subfolder of a folder: its name in the folder, its size and modification time (seconds since the
    epoch; 0 for a subfolder of an object store, which has none)."""

    name: str
    size: int
    modified: float
    is_dir: bool = False


class Folder(ABC):
    """A folder: a local directory, or every object under a prefix of a bucket or container."""

    uri: str

    @abstractmethod
    def child(self, *names: str) -> Folder:
        """The folder at ``names`` under this one."""

    @abstractmethod
    def entries(self) -> list[Entry]:
        """The files and subfolders directly in the folder, sorted by name; none when it does not exist."""

    @abstractmethod
    def stat(self, name: str) -> Entry | None:
        """A file of the folder, or None."""

    @abstractmethod
    def read_bytes(self, name: str) -> bytes:
        """A file's content; :class:`FileNotFoundError` when it is not there."""

    @abstractmethod
    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a file whole: readers see the old content or the new one, never a part."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove a file; nothing when it is not there."""

    @abstractmethod
    def versioned(self, name: str) -> tuple[bytes, str] | None:
        """A file's content and a token of this version of it, or None when it is not there."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> str:
        """Write a file only if it does not exist (:class:`AlreadyExists`); the new version's token."""

    @abstractmethod
    def replace(self, name: str, data: bytes, version: str) -> str:
        """Overwrite a file only if it is still at ``version`` (:class:`Changed`); the new version's token."""

    @abstractmethod
    def total_bytes(self) -> int:
        """The bytes of every file under the folder, at any depth."""

    @abstractmethod
    def sibling(self, name: str) -> Folder:
        """The folder ``name`` beside this one, under the same parent."""

    @abstractmethod
    def move(self, name: str, target: Folder) -> None:
        """Move the file or subfolder ``name`` (a path under this folder) to the same path under ``target``, a folder
        of the same store. A store moves a subfolder object by object: a crash part-way leaves some of it in each
        place, and moving it again finishes the move."""

    def copy_tree(self, target: Folder, *, skip: Callable[[str], bool] = lambda name: False) -> None:
        """Copy every file under the folder to the same path under ``target``, but those whose name ``skip``
        picks."""
        for relative, _ in self.walk():
            *parents, name = relative.split("/")
            if not skip(name):
                target.child(*parents).write_bytes(name, self.read_bytes(relative))

    def is_dir(self) -> bool:
        return bool(self.entries())

    def walk(self) -> Iterator[tuple[str, Entry]]:
        """Every file under the folder at any depth, by its path relative to the folder (``a/b/c.json``), from
        paged listings (no object is read). Subfolders are not reported on their own."""
        pending = [""]
        while pending:
            prefix = pending.pop()
            place = self.child(*prefix.split("/")) if prefix else self
            for entry in place.entries():
                relative = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_dir:
                    pending.append(relative)
                else:
                    yield relative, entry

    def exists(self, name: str) -> bool:
        return self.stat(name) is not None

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def read_head(self, name: str, size: int) -> bytes:
        """A file's first ``size`` bytes (all of a smaller one); :class:`FileNotFoundError` when it is not there."""
        return self.read_bytes(name)[:size]

    @abstractmethod
    def read_bounded(self, name: str, limit: int) -> bytes:
        """A file that someone else may have planted (a checkpoint's): a regular file of at most ``limit`` bytes, not
        through a link, never an open that blocks (a FIFO, a device), else :class:`NotReadable`;
        :class:`FileNotFoundError` when it is not there, :class:`IsADirectoryError` for a folder."""

    def read_bounded_text(self, name: str, limit: int) -> str:
        """:meth:`read_bounded` as UTF-8; :class:`NotReadable` when it is not."""
        try:
            return self.read_bounded(name, limit).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotReadable(self.where(name), f"not UTF-8 text (byte {exc.start})") from None

    def where(self, name: str) -> str:
        """How a message names a file of the folder."""
        return f"{self.uri.rstrip('/')}/{name}"

    def __str__(self) -> str:
        return self.uri


class LocalFolder(Folder):
    """A local (or mounted) directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.uri = str(self.path)

    def child(self, *names: str) -> LocalFolder:
        return LocalFolder(self.path.joinpath(*names))

    def sibling(self, name: str) -> LocalFolder:
        return LocalFolder(self.path.with_name(name))

    def move(self, name: str, target: Folder) -> None:
        if not isinstance(target, LocalFolder):
            raise StoreError(f"cannot move {self.where(name)} to another store ({target})")
        (target.path / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path / name, target.path / name)

    def copy_tree(self, target: Folder, *, skip: Callable[[str], bool] = lambda name: False) -> None:
        if not isinstance(target, LocalFolder):
            super().copy_tree(target, skip=skip)
            return
        # copy2 keeps modification times: a commit's time is when its batch ended.
        shutil.copytree(self.path, target.path, ignore=lambda _, names: {name for name in names if skip(name)})

    def entries(self) -> list[Entry]:
        try:
            scanned = list(os.scandir(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for entry in scanned:
            try:
                info = entry.stat()
            except FileNotFoundError:
                continue
            except OSError:  # a link in a loop, or to where this user cannot look: listed, for a read to refuse
                found.append(Entry(entry.name, 0, 0.0))
                continue
            found.append(Entry(entry.name, info.st_size, info.st_mtime, entry.is_dir()))
        return sorted(found, key=lambda entry: entry.name)

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def stat(self, name: str) -> Entry | None:
        try:
            info = (self.path / name).stat()
        except OSError:  # not there, or a link in a loop
            return None
        return Entry(name, info.st_size, info.st_mtime, (self.path / name).is_dir())

    def read_bytes(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def read_head(self, name: str, size: int) -> bytes:
        with open(self.path / name, "rb") as handle:
            return handle.read(size)

    def read_bounded(self, name: str, limit: int) -> bytes:
        where = self.where(name)
        try:
            # O_NONBLOCK: opening a FIFO with no writer would wait for one forever.
            descriptor = os.open(self.path / name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotReadable(where, "a symbolic link, not a file; Sluice reads no checkpoint file through a "
                                         "link") from None
            raise
        with os.fdopen(descriptor, "rb") as handle:
            mode = os.fstat(descriptor).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "a folder", where)
            if not stat.S_ISREG(mode):
                raise NotReadable(where, f"not a regular file (a {_file_kind(mode)})")
            data = handle.read(limit + 1)  # not the size fstat told: the file may grow while it is read
        if len(data) > limit:
            raise NotReadable(where, f"larger than {limit} bytes, more than such a file ever holds")
        return data

    def write_bytes(self, name: str, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path / name, data)

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / name).unlink()

    @staticmethod
    def _token(info: os.stat_result) -> str:
        return f"{info.st_ino}:{info.st_mtime_ns}:{info.st_size}"

    def versioned(self, name: str) -> tuple[bytes, str] | None:
        try:
            with open(self.path / name, "rb") as handle:
                return handle.read(), self._token(os.fstat(handle.fileno()))
        except FileNotFoundError:
            return None

    def create(self, name: str, data: bytes) -> str:
        # Written aside, then linked into place: link() fails if the file exists, and a reader never sees it
        # empty or half-written (a crash between the two leaves only the temporary file).
        self.path.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
            try:
                os.link(temporary, self.path / name)
            except FileExistsError:
                raise AlreadyExists(f"{self.where(name)} exists") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        return self._token((self.path / name).stat())

    def replace(self, name: str, data: bytes, version: str) -> str:
        # Local writers of one checkpoint share a host and its lock (sluice.storage.lock); this compare-then-swap is
        # for the same calls on every store, not a cross-host guarantee.
        current = self.versioned(name)
        if current is None or current[1] != version:
            raise Changed(f"{self.where(name)} changed since it was read")
        self.write_bytes(name, data)
        return self._token((self.path / name).stat())

    def total_bytes(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.path):
            for file in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(folder, file)).st_size
        return total


class ObjectFolder(Folder):
    """Every object under ``prefix`` of an object store (obstore)."""

    def __init__(self, store: Any, prefix: str, uri: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.uri = uri.rstrip("/")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, *names: str) -> ObjectFolder:
        parts = [part for name in names for part in name.split("/") if part]
        return ObjectFolder(self.store, "/".join([self.prefix, *parts]) if self.prefix else "/".join(parts),
                            "/".join([self.uri, *parts]))

    def sibling(self, name: str) -> ObjectFolder:
        if not self.prefix:
            raise StoreError(f"{self.uri} is the root of its bucket: it has no folder beside it")
        parent = self.prefix.rpartition("/")[0]
        return ObjectFolder(self.store, f"{parent}/{name}" if parent else name,
                            f"{self.uri.rpartition('/')[0]}/{name}")

    def move(self, name: str, target: Folder) -> None:
        import obstore

        there = self._same_store(name, target)
        # A subfolder is every object under its prefix (listed whole before any moves); a name with nothing under
        # it is one object. On a store with real directories (ADLS with a hierarchical namespace) a folder has
        # objects under it too, so the listing decides.
        inside = [relative for relative, _ in self.child(name).walk()]
        for relative in inside or [""]:
            key = f"{name}/{relative}" if relative else name
            obstore.rename(self.store, self._key(key), there._key(key))

    def copy_tree(self, target: Folder, *, skip: Callable[[str], bool] = lambda name: False) -> None:
        import obstore

        if not isinstance(target, ObjectFolder) or target.store is not self.store:
            super().copy_tree(target, skip=skip)
            return
        for relative in [relative for relative, _ in self.walk()]:  # copied on the store's side
            if not skip(relative.rsplit("/", 1)[-1]):
                obstore.copy(self.store, self._key(relative), target._key(relative))

    def _same_store(self, name: str, target: Folder) -> ObjectFolder:
        if not isinstance(target, ObjectFolder) or target.store is not self.store:
            raise StoreError(f"cannot move {self.where(name)} to another store ({target})")
        return target

    def entries(self) -> list[Entry]:
        import obstore

        listing = obstore.list_with_delimiter(self.store, f"{self.prefix}/" if self.prefix else None)
        cut = len(self.prefix) + 1 if self.prefix else 0
        found = [Entry(meta["path"][cut:], int(meta["size"]), meta["last_modified"].timestamp())
                 for meta in listing["objects"]]
        found += [Entry(prefix[cut:].rstrip("/"), 0, 0.0, True) for prefix in listing["common_prefixes"]]
        return sorted(found, key=lambda entry: entry.name)

    def stat(self, name: str) -> Entry | None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            meta = obstore.head(self.store, self._key(name))
        except (NotFoundError, FileNotFoundError):
            return None
        return Entry(name, int(meta["size"]), meta["last_modified"].timestamp())

    def read_bytes(self, name: str) -> bytes:
        versioned = self.versioned(name)
        if versioned is None:
            raise FileNotFoundError(self.where(name))
        return versioned[0]

    def read_bounded(self, name: str, limit: int) -> bytes:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = obstore.get(self.store, self._key(name))
        except (NotFoundError, FileNotFoundError):
            raise FileNotFoundError(self.where(name)) from None
        # The size comes with the response's headers, before its body is read.
        if int(result.meta["size"]) > limit:
            raise NotReadable(self.where(name), f"larger than {limit} bytes, more than such a file ever holds")
        return bytes(result.bytes())

    def read_head(self, name: str, size: int) -> bytes:
        import obstore

        entry = self.stat(name)
        if entry is None:
            raise FileNotFoundError(self.where(name))
        if entry.size == 0:
            return b""
        return bytes(obstore.get_range(self.store, self._key(name), start=0, length=min(size, entry.size)))

    def write_bytes(self, name: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, self._key(name), data)

    def delete(self, name: str) -> None:
        import obstore
        from obstore.exceptions import NotFoundError

        with contextlib.suppress(NotFoundError, FileNotFoundError):
            obstore.delete(self.store, self._key(name))

    def versioned(self, name: str) -> tuple[bytes, str] | None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = obstore.get(self.store, self._key(name))
        except (NotFoundError, FileNotFoundError):
            return None
        return bytes(result.bytes()), _token(result.meta)

    def _put(self, name: str, data: bytes, mode: Any) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, NotSupportedError, PreconditionError

        try:
            result = obstore.put(self.store, self._key(name), data, mode=mode)
        except AlreadyExistsError:
            raise AlreadyExists(f"{self.where(name)} exists") from None
        except (NotFoundError, FileNotFoundError):  # replaced a version that was deleted meanwhile
            raise Changed(f"{self.where(name)} is gone since it was read") from None
        except PreconditionError:
            if mode == "create":
                raise AlreadyExists(f"{self.where(name)} exists") from None
            raise Changed(f"{self.where(name)} changed since it was read") from None
        except NotSupportedError as exc:
            raise NoConditionalWrites(f"{self.uri}: the store has no conditional writes ({exc})") from exc
        return _token(result)

    def create(self, name: str, data: bytes) -> str:
        return self._put(name, data, "create")

    def replace(self, name: str, data: bytes, version: str) -> str:
        # S3 and Azure match the ETag; GCS matches the generation, which object_store calls the version.
        e_tag, _, generation = version.partition("\n")
        condition = {key: value for key, value in (("e_tag", e_tag), ("version", generation)) if value}
        return self._put(name, data, condition)

    def walk(self) -> Iterator[tuple[str, Entry]]:
        import obstore

        cut = len(self.prefix) + 1 if self.prefix else 0
        for page in obstore.list(self.store, f"{self.prefix}/" if self.prefix else None):
            for meta in page:
                relative = meta["path"][cut:]
                yield relative, Entry(relative.rsplit("/", 1)[-1], int(meta["size"]),
                                      meta["last_modified"].timestamp())

    def total_bytes(self) -> int:
        import obstore

        return sum(int(meta["size"]) for page in obstore.list(self.store, f"{self.prefix}/" if self.prefix else None)
                   for meta in page)


def write_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Write a local file whole: into a new temporary file of its folder (a name no one can predict, created with
    O_EXCL, so never through a link planted in its place), then renamed over it. ``mode`` defaults to the replaced
    file's, else 0644."""
    target = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        if mode is None:  # mkstemp's 0600 would hide the file from the other users of a shared folder (Spark)
            try:
                mode = stat.S_IMODE(os.stat(target).st_mode)
            except FileNotFoundError:
                mode = 0o644
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
             (stat.S_ISSOCK, "socket"))
    return next((kind for test, kind in kinds if test(mode)), "special file")


def _token(meta: Mapping[str, Any]) -> str:
    """A version token for a conditional replace: the ETag and the version (a GCS generation), either may be
    empty."""
    return f"{meta.get('e_tag') or ''}\n{meta.get('version') or ''}"


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def scheme_of(uri: str) -> str:
    """The store a path lives on: ``file`` for a local path, else its scheme (``s3a`` is ``s3``)."""
    match = _URI.match(uri)
    if match is None:
        return "file"
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise StoreError(f"{uri}: Sluice reads and writes local paths and {', '.join(sorted(set(SCHEMES) - {'file'}))}"
                         f" URIs, not {scheme}://")
    return SCHEMES[scheme]


def folder(uri: str | os.PathLike[str]) -> Folder:
    """The folder at ``uri``: a local path (or ``file://``), or a prefix of a bucket or container, whose store reads
    its endpoint and credentials from the environment (:mod:`sluice.connections.storage`), or from the credentials
    scoped to the work at hand (:mod:`sluice.storage.credentials`)."""
    text = os.fspath(uri)
    if is_local(text):
        return LocalFolder(text.removeprefix("file://"))
    scheme = scheme_of(text)
    match = _URI.match(text)
    assert match is not None
    authority, prefix = match.group(2), match.group(3)
    root = f"{scheme}://{authority}/"
    return ObjectFolder(_store(root, credentials.current()), prefix, text)


@lru_cache(maxsize=32)
def _store(root: str, scoped: tuple[tuple[str, str], ...]) -> Any:
    """One client per bucket and credentials: obstore keeps its connections in it."""
    from obstore.store import from_url

    config, client = credentials.store_config(root.split("://", 1)[0], scoped)
    if root.startswith("s3://"):
        # AWS S3 has honoured If-None-Match and If-Match since 2024; the lock needs both.
        config.setdefault("conditional_put", "etag")
    try:
        return from_url(root, config=config or None, client_options=client or None)  # type: ignore[arg-type]
    except Exception as exc:  # obstore raises per-store configuration errors
        raise StoreError(f"{root}: cannot open the store ({exc})") from exc
