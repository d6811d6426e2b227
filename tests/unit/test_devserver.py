"""The pure parts of `make run`, `make stop` and `make clean` (sluice.cli.devserver): /proc parsing, the membership of
the recorded sessions in a fake process table, and the rules of what `make clean` may delete."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.cli.devserver import (
    Address,
    ProcessStat,
    SessionRecord,
    all_admins,
    clean,
    jwt_secret,
    keep_saying,
    main,
    members,
    parse_record,
    parse_stat,
    read_processes,
    refusal,
    run_environment,
    status_line,
    unpaused_dags,
    wait_for_warm,
    warm_command,
    warm_jvm_environment,
)


def stat_line(pid: int, name: str, state: str = "S", parent: int = 1, session: int = 0, start: int = 100) -> str:
    """A /proc/<pid>/stat line: 52 fields, the start time 22nd."""
    middle = [state, str(parent), str(session or pid), str(session or pid)] + ["0"] * 15 + [str(start)]
    return f"{pid} ({name}) " + " ".join(middle + ["0"] * 30) + "\n"


@pytest.mark.parametrize("name", ["bash", "python3 -m x", "a) b", "(sd-pam)", ") S 1 2 3", "x)  (y"])
def test_a_stat_line_is_read_after_the_last_closing_parenthesis_of_the_name(name: str) -> None:
    assert parse_stat(stat_line(4242, name, "R", parent=7, session=4000, start=987654)) == ProcessStat(
        pid=4242, state="R", parent=7, session=4000, start=987654)


def test_the_start_time_is_field_22_of_a_real_stat_line() -> None:
    line = ("1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5678 1000 10 "
            + " ".join(["0"] * 30))
    assert parse_stat(line).start == 5678
    assert parse_stat(line).session == 1234


@pytest.mark.parametrize("line", ["", "1234", "1234 bash S 1 2 3", "1234 (bash) S 1 2 3", "x (bash) " + "0 " * 50])
def test_a_line_that_is_not_a_stat_line_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(line)


def test_the_process_table_skips_what_is_not_a_process(tmp_path: Path) -> None:
    for pid, text in ((10, stat_line(10, "a b")), (11, "garbage"), (12, stat_line(12, "z", state="Z"))):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text)
    (tmp_path / "self").mkdir()
    (tmp_path / "13").mkdir()  # exited while the table was read

    assert sorted(read_processes(tmp_path)) == [10, 12]


def test_a_record_keeps_only_its_well_formed_lines() -> None:
    text = "scheduling 100 5000\napi-server 200 5001\n\nbroken 300\nname x 7\nextra 400 6000 more\n"
    assert parse_record(text) == [SessionRecord("scheduling", 100, 5000), SessionRecord("api-server", 200, 5001),
                                  SessionRecord("extra", 400, 6000)]


def table(*processes: ProcessStat) -> dict[int, ProcessStat]:
    return {process.pid: process for process in processes}


def process(pid: int, parent: int, session: int, start: int, state: str = "S") -> ProcessStat:
    return ProcessStat(pid=pid, state=state, parent=parent, session=session, start=start)


RECORDS = [SessionRecord("scheduling", 100, 5000), SessionRecord("api-server", 200, 5001)]
TABLE = table(
    process(1, 0, 1, 1),
    process(90, 1, 90, 4900),  # `make run` itself: not a member
    process(100, 90, 100, 5000),  # the scheduling leader
    process(101, 100, 100, 5002),  # the scheduler
    process(102, 101, 100, 5003, state="Z"),  # an exited task process
    process(103, 101, 103, 5004),  # spark-submit, in a session of its own
    process(104, 103, 103, 5005),  # its JVM
    process(200, 90, 200, 5001),  # the API leader
    process(201, 200, 200, 5006),
    process(300, 1, 300, 10),  # a bystander
)


def test_the_members_are_the_live_processes_of_the_recorded_sessions_and_their_descendants() -> None:
    membership = members(RECORDS, TABLE)

    assert membership.processes == {100: 5000, 101: 5002, 103: 5004, 104: 5005, 200: 5001, 201: 5006}
    assert membership.recycled == []


def test_only_one_session_when_asked() -> None:
    assert set(members(RECORDS, TABLE, only=200).processes) == {200, 201}
    assert members(RECORDS, TABLE, only=300).processes == {}


def test_a_session_whose_leader_has_exited_still_has_members() -> None:
    without_leader = {pid: stat for pid, stat in TABLE.items() if pid != 100}
    zombie_leader = {**TABLE, 100: process(100, 90, 100, 5000, state="Z")}

    for processes in (without_leader, zombie_leader):
        assert set(members(RECORDS, processes).processes) == {101, 103, 104, 200, 201}


def test_a_recorded_pid_given_to_another_process_is_left_alone_with_its_session() -> None:
    recycled = {**TABLE, 200: process(200, 1, 200, 9999), 201: process(201, 200, 200, 10000)}

    membership = members(RECORDS, recycled)

    assert set(membership.processes) == {100, 101, 103, 104}
    assert membership.recycled == [200]


def test_a_process_older_than_the_leader_does_not_join_its_session() -> None:
    older = {**TABLE, 150: process(150, 1, 100, 4000)}
    assert 150 not in members(RECORDS, older).processes


def test_nothing_is_a_member_without_a_record() -> None:
    assert members([], TABLE).processes == {}


CHECKOUT = "/home/me/sluice"


def never_tracked(path: str) -> bool:
    return False


@pytest.mark.parametrize(("path", "resolved", "reason"), [
    ("data", f"{CHECKOUT}/data", None),
    (".airflow", f"{CHECKOUT}/.airflow", None),
    (".venvs", f"{CHECKOUT}/.venvs", None),
    (".", CHECKOUT, ".: is the checkout itself"),
    (".venv", f"{CHECKOUT}/.venv", ".venv: is or is inside .venv"),
    ("cache", f"{CHECKOUT}/.venv/lib", "cache: is or is inside .venv/lib"),
    ("git", f"{CHECKOUT}/.git", "git: is or is inside .git"),
    ("/tmp/x", "/tmp/x", f"/tmp/x: resolves to /tmp/x, outside the checkout {CHECKOUT}"),
    ("sibling", f"{CHECKOUT}-old/data", f"sibling: resolves to {CHECKOUT}-old/data, outside the checkout {CHECKOUT}"),
    ("/", "/", f"/: resolves to /, outside the checkout {CHECKOUT}"),
])
def test_the_rules_of_make_clean(path: str, resolved: str, reason: str | None) -> None:
    assert refusal(path, resolved, CHECKOUT, never_tracked) == reason


def test_make_clean_refuses_a_folder_holding_tracked_files() -> None:
    assert refusal("dags", f"{CHECKOUT}/dags", CHECKOUT, lambda path: path.endswith("/dags")) == (
        "dags: holds files under version control")


def test_clean_deletes_inside_the_checkout_and_nothing_at_all_when_one_path_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkout = tmp_path / "checkout"
    elsewhere = tmp_path / "elsewhere"
    for folder in (checkout / "data", checkout / ".cache", checkout / ".venv", elsewhere):
        folder.mkdir(parents=True)
        (folder / "marker").write_text("x")
    (checkout / "linked").symlink_to(elsewhere)

    assert clean(["data", "linked", "missing"], str(checkout)) == 1
    assert "deleting nothing" in capsys.readouterr().err
    assert (checkout / "data" / "marker").exists() and (elsewhere / "marker").exists()

    assert clean([str(checkout / "data"), ".cache", "missing"], str(checkout)) == 0
    assert capsys.readouterr().out.startswith(f"rm -rf {checkout}/data {checkout}/.cache")
    assert sorted(path.name for path in checkout.iterdir()) == [".venv", "linked"]


def test_make_run_signs_tokens_with_a_long_key_of_its_own(tmp_path: Path) -> None:
    key = jwt_secret(str(tmp_path))

    assert len(key) >= 64 and jwt_secret(str(tmp_path)) == key, "made once, kept"
    assert (tmp_path / "jwt-secret").stat().st_mode & 0o777 == 0o600


def test_the_environment_of_make_run() -> None:
    loopback = run_environment(Address("127.0.0.1", 8080), "/home", "/data", {})
    assert loopback["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    assert loopback["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "True"
    assert loopback["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"
    anywhere = run_environment(Address("::", 8081), "/home", "/data", {})
    assert anywhere["AIRFLOW__API__HOST"] == "::" and anywhere["AIRFLOW__API__PORT"] == "8081"
    assert anywhere["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8081/execution/"
    assert Address("::1", 8080).url == "http://[::1]:8080"


@pytest.mark.parametrize(("host", "environment", "expected"), [
    ("127.0.0.1", {}, "True"),
    ("localhost", {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False"}, "False"),
    ("::1", {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": ""}, "True"),
    ("0.0.0.0", {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}, "False"),
])
def test_nobody_logs_in_only_on_loopback(host: str, environment: dict[str, str], expected: str) -> None:
    assert all_admins(Address(host, 8080), environment) == expected


def test_the_dags_that_were_paused() -> None:
    output = "dag_id        is_paused\nbackfill      True\nlag_monitor   False\n\nwarning: x True\n"
    assert unpaused_dags(output) == ["backfill"]


@pytest.mark.parametrize("arguments", [
    ["run", "--port", "0"],
    ["run", "--port", "http"],
    ["stop", "--stop-timeout", "-1"],
    ["stop", "--stop-timeout", "soon"],
    ["launch"],
])
def test_bad_arguments_are_refused(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*arguments, "--airflow-home", "/h", "--data-root", "/d"])
    assert exit_.value.code == 2
    assert "expected" in capsys.readouterr().err or arguments == ["launch"]


@pytest.fixture
def impostor() -> Iterator[int]:
    """Something else on a port: it accepts every connection and answers as a warm server's ping might."""
    listening = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listening.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listening.accept()
                with connection:
                    connection.sendall(b'{"pong": {"app_id": "local-forged"}}\n')

    thread = threading.Thread(target=serve)
    thread.start()
    yield listening.getsockname()[1]
    stop.set()
    thread.join(timeout=10)
    listening.close()


def test_make_run_waits_for_the_warm_server_to_prove_itself_not_for_an_open_port(
        impostor: int, capsys: pytest.CaptureFixture[str]) -> None:
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert wait_for_warm(leader, impostor, "t" * 32) is False
    finally:
        leader.kill()
        leader.wait()
    assert "could not prove that it holds the warm server's token" in capsys.readouterr().err


def test_the_warm_server_of_make_run_listens_on_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_SPARK_UI_ADDRESS", raising=False)
    command = warm_command(15041)
    for setting in ("spark.driver.bindAddress=127.0.0.1", "spark.driver.host=127.0.0.1", "spark.ui.killEnabled=false"):
        assert command[command.index(setting) - 1] == "--conf"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert warm_jvm_environment()["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_a_ui_address_that_is_not_one_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.errors import SluiceError

    for bad in ("every address", "localhost", "127.0.0.1:4040"):
        monkeypatch.setenv("SLUICE_SPARK_UI_ADDRESS", bad)
        with pytest.raises(SluiceError, match=r"SLUICE_SPARK_UI_ADDRESS: .* is an IP address"):
            warm_jvm_environment()
    monkeypatch.setenv("SLUICE_SPARK_UI_ADDRESS", "0.0.0.0")
    assert warm_jvm_environment()["SPARK_LOCAL_IP"] == "0.0.0.0"


def test_make_run_says_where_the_ui_is_again_on_a_short_status_line(capsys: pytest.CaptureFixture[str]) -> None:
    address = Address("127.0.0.1", 8080)
    assert status_line(address, 125) == \
        "make run: up 2 min; Airflow UI at http://127.0.0.1:8080; 'make stop' or Ctrl-C stops it"
    assert "up 1 h 05 min" in status_line(address, 3900)
    done = threading.Event()
    saying = threading.Thread(target=keep_saying, args=(address, 0.0, done, 0.05))
    saying.start()
    threading.Timer(1.0, done.set).start()  # twenty intervals: two lines even when the thread waits for a core
    saying.join(timeout=5)
    lines = capsys.readouterr().out.splitlines()
    assert not saying.is_alive() and len(lines) >= 2
    assert all("Airflow UI at http://127.0.0.1:8080" in line for line in lines)
    assert len(max(lines, key=len)) < 120, "a short line"
