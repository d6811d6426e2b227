"""The code archive shipped to a cluster's executors: what it holds, where it lives, and what is never shipped."""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
from pathlib import Path

import pytest

from sluice_airflow.hooks import CODE_ARCHIVE_FOLDER, CodeArchiveError, SluiceSparkSubmitHook, project_archive


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    private = tmp_path / "code"
    private.mkdir(mode=0o700)
    return private


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_the_code_archive_holds_what_executors_import(folder: Path) -> None:
    path = project_archive(folder)
    names = zipfile.ZipFile(path).namelist()
    assert {"sluice/__init__.py", "sluice/streams.yaml", "sluice_spark/rs/sink.py",
            "sluice_spark/runner/run.py"} <= set(names)
    assert not [name for name in names if name.startswith("sluice_airflow") or "__pycache__" in name]
    assert project_archive(folder) == path  # named by content: built once per version of the code
    assert [p.name for p in folder.iterdir()] == [Path(path).name], "no temporary is left behind"


def test_the_archive_is_named_by_the_sha256_of_its_bytes_which_the_code_alone_decides(folder: Path,
                                                                                      tmp_path: Path) -> None:
    path = Path(project_archive(folder))
    assert path.name == f"sluice-code-{sha256(path)}.zip"
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    assert Path(project_archive(other)).read_bytes() == path.read_bytes(), "the same code gives the same bytes"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_by_default_the_archive_is_built_in_a_private_folder_of_the_airflow_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow-home"))
    path = Path(project_archive())
    assert path.parent == tmp_path / "airflow-home" / CODE_ARCHIVE_FOLDER
    status = path.parent.stat()
    assert stat.S_IMODE(status.st_mode) == 0o700 and status.st_uid == os.geteuid()


def test_a_planted_archive_with_other_content_is_not_shipped(folder: Path) -> None:
    path = Path(project_archive(folder))
    expected = path.read_bytes()
    with zipfile.ZipFile(path, "w") as planted:
        planted.writestr("sluice/__init__.py", "import os; os.system('steal')")
    assert project_archive(folder) == str(path)
    assert path.read_bytes() == expected, "rebuilt from the code"


def test_a_symlink_at_the_archives_name_is_refused(folder: Path, tmp_path: Path) -> None:
    path = Path(project_archive(folder))
    swapped = tmp_path / "swapped.zip"
    swapped.write_bytes(path.read_bytes())  # even with the right content: a link can be turned elsewhere later
    path.unlink()
    path.symlink_to(swapped)
    with pytest.raises(CodeArchiveError, match=f"{path} is a symbolic link"):
        project_archive(folder)
    assert path.is_symlink()


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_an_archive_others_can_write_is_refused(folder: Path, mode: int) -> None:
    path = Path(project_archive(folder))
    path.chmod(mode)
    with pytest.raises(CodeArchiveError, match=f"{path} belongs to uid .* with mode {mode:o}"):
        project_archive(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_archive_of_another_user_is_refused(folder: Path) -> None:
    path = Path(project_archive(folder))
    os.chown(path, 4242, -1)
    with pytest.raises(CodeArchiveError, match="belongs to uid 4242"):
        project_archive(folder)


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o1777])
def test_a_folder_others_can_enter_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(CodeArchiveError, match=f"{shared} has mode {mode & 0o7777:o}"):
        project_archive(shared)
    assert list(shared.iterdir()) == []


def test_a_folder_of_another_user_is_refused(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.raises(CodeArchiveError, match=f"{folder} belongs to uid"):
        project_archive(folder)


def test_a_symlink_for_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(folder)
    with pytest.raises(CodeArchiveError, match="is a symbolic link, not a directory"):
        project_archive(tmp_path / "link")


def test_the_hook_ships_the_archive_to_a_cluster_master_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_CLUSTER",
                       '{"conn_type": "spark", "host": "spark://10.0.0.1", "port": 7077}')
    assert SluiceSparkSubmitHook(conn_id="sluice_local").ship_project_code() is None
    given = SluiceSparkSubmitHook(conn_id="sluice_cluster", py_files="mine.zip")
    assert given.ship_project_code() is None and given._py_files == "mine.zip"

    hook = SluiceSparkSubmitHook(conn_id="sluice_cluster")
    shipped = hook.ship_project_code()
    assert shipped is not None and Path(shipped).parent == tmp_path / CODE_ARCHIVE_FOLDER
    command = hook._build_spark_submit_command("app.py")
    assert command[command.index("--py-files") + 1] == shipped
