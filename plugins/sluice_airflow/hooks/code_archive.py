"""The project's code for a cluster's executors: a zip of the packages they import, built the same way every time
and kept in a private folder (:func:`project_archive`); :class:`~sluice_airflow.hooks.SluiceSparkSubmitHook` ships it
as ``--py-files``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import stat
import zipfile
from importlib.util import find_spec
from pathlib import Path

from airflow.sdk.exceptions import AirflowException, AirflowFailException

# The packages executors import: the core and the Spark side (not the Airflow plugins).
SHIPPED_PACKAGES = ("sluice", "sluice_spark")
CODE_ARCHIVE_FOLDER = "sluice-code"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

log = logging.getLogger(__name__)


class CodeArchiveError(AirflowFailException):
    """The code archive, or its folder, is not what this user built: it is not shipped, and a retry would find
    the same."""


def project_archive(folder: str | os.PathLike[str] | None = None) -> str:
    """A zip of the packages executors import, for ``--py-files``: a cluster's executors run Sluice's Python code
    (the rs Delta sink and source, the transforms) and need not have the project installed.

    The zip is built the same way every time (sorted entries, fixed times and modes), so the same code gives the
    same bytes, and it is named by their SHA-256: built once per version of the code, and two tasks that build it
    at once write the same bytes. It lives in a private folder, ``$AIRFLOW_HOME/sluice-code`` unless ``folder`` is
    given: a directory owned by this user with mode 0700 (created so; anything else is refused, as another local
    user could plant or swap files in it). Before its path is returned the zip is checked: a regular file (not a
    link), owned by this user, writable by no one else, holding exactly the bytes just built. A file of this user
    with other content is rebuilt; anything else under its name raises :class:`CodeArchiveError`.
    """
    files = _shipped_files()
    content = _deterministic_zip(files)
    digest = hashlib.sha256(content).hexdigest()
    home = _private_folder(Path(folder) if folder is not None else _default_archive_folder())
    target = home / f"sluice-code-{digest}.zip"
    if _holds(target, digest):
        return str(target)
    from sluice.storage.store import write_atomically

    write_atomically(target, content, mode=0o600)
    if not _holds(target, digest):
        raise CodeArchiveError(f"the code archive {target} changed while it was written; it is not shipped")
    return str(target)


def _default_archive_folder() -> Path:
    # Airflow's own default home when AIRFLOW_HOME is not set.
    return Path(os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow")) / CODE_ARCHIVE_FOLDER


def _shipped_files() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in SHIPPED_PACKAGES:
        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise AirflowException(f"cannot locate the {package} package; install the project")
        root = Path(next(iter(spec.submodule_search_locations)))
        files += sorted((path.relative_to(root.parent).as_posix(), path) for path in root.rglob("*")
                        if path.is_file() and path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts)
    return files


def _deterministic_zip(files: list[tuple[str, Path]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, path in files:
            entry = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    return buffer.getvalue()


def _private_folder(folder: Path) -> Path:
    """``folder``, created with mode 0700 if missing; refused unless it is a directory of this user that no one
    else can enter or write."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    status = os.lstat(folder)
    if not stat.S_ISDIR(status.st_mode):
        raise CodeArchiveError(f"the code archive folder {folder} is a {_kind(status.st_mode)}, not a directory; "
                               "remove it or give another folder")
    if status.st_uid != os.geteuid():
        raise CodeArchiveError(f"the code archive folder {folder} belongs to uid {status.st_uid}, not to this user "
                               f"(uid {os.geteuid()}); give a folder of this user")
    if stat.S_IMODE(status.st_mode) & 0o077:
        raise CodeArchiveError(f"the code archive folder {folder} has mode {stat.S_IMODE(status.st_mode):o}: other "
                               "users could plant or swap the code executors run. Make it 0700 (chmod 700) or "
                               "give another folder")
    return folder


def _holds(path: Path, digest: str) -> bool:
    """Whether ``path`` is this user's regular file, writable by no one else, whose SHA-256 is ``digest``;
    False when it is missing or its content differs. Anything else raises :class:`CodeArchiveError`."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        try:
            kind = _kind(os.lstat(path).st_mode)
        except OSError:
            kind = "file"
        raise CodeArchiveError(f"the code archive {path} is a {kind} that cannot be opened safely ({exc}); it is "
                               "not shipped. Find out how it got there, then remove it") from exc
    with os.fdopen(descriptor, "rb") as archive:
        status = os.fstat(archive.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise CodeArchiveError(f"the code archive {path} is a {_kind(status.st_mode)}, not a regular file; it "
                                   "is not shipped. Find out how it got there, then remove it")
        if status.st_uid != os.geteuid() or stat.S_IMODE(status.st_mode) & 0o022:
            raise CodeArchiveError(f"the code archive {path} belongs to uid {status.st_uid} with mode "
                                   f"{stat.S_IMODE(status.st_mode):o}; only a file of this user (uid {os.geteuid()}) "
                                   "that no one else can write is shipped. Find out how it got there, then remove it")
        content = hashlib.sha256()
        for chunk in iter(lambda: archive.read(1 << 20), b""):
            content.update(chunk)
        found = content.hexdigest()
    if found != digest:
        log.warning("The code archive %s does not hold the code it is named after; rebuilding it", path)
    return found == digest


_FILE_KINDS = ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
               (stat.S_ISREG, "regular file"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "special file")
