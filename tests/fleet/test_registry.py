"""A shared fleet's record (agrpo/fleet/registry.py) in a real private runtime directory: written 0600 in a 0700
folder, read back typed; missing, stale (its process gone, or its pid reused), planted or garbage records refused
with one paragraph naming the file (ConfigError, exit 2), never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from agrpo.errors import ConfigError
from agrpo.fleet import registry
from agrpo.fleet.registry import FleetRecord, StaleFleet, list_fleets, read_fleet, remove_fleet, write_fleet
from agrpo.processes.private_dir import RUNTIME_ENV, runtime_dir
from agrpo.processes.watchdog import start_time


@pytest.fixture
def fleets(monkeypatch, tmp_path):
    """This test's own runtime directory; the folder the records go to."""
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    return tmp_path / "rt" / "fleets"


def a_record(name: str = "demo", pid: int | None = None, **changes) -> FleetRecord:
    pid = os.getpid() if pid is None else pid
    fleet = FleetRecord(
        name=name,
        url="http://127.0.0.1:8101",
        admin_token="a" * 43,
        model="/models/tiny-qwen2",
        max_model_len=256,
        max_lora_rank=8,
        max_tenants=4,
        versions_per_tenant=3,
        pid=pid,
        pgid=pid,
        started_at=time.time(),
        run_dir="/runs/fleet",
        uid=os.geteuid(),
        pid_start=start_time(pid),
    )
    return replace(fleet, **changes)


def gone_pid() -> int:
    """The pid of a process that ran and was reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_record_is_written_0600_in_a_0700_folder_and_read_back(fleets):
    fleet = a_record()
    write_fleet(fleet)
    assert stat.S_IMODE(os.stat(fleets).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(fleets.parent).st_mode) == 0o700
    path = fleets / "demo.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(fleets)) == ["demo.json"]  # the temporary file was renamed, none left
    assert json.loads(path.read_text())["admin_token"] == "a" * 43
    assert read_fleet("demo") == fleet
    assert list_fleets() == ([fleet], [], {})
    assert remove_fleet("demo") is True and remove_fleet("demo") is False
    assert list_fleets() == ([], [], {})


def test_no_such_fleet_is_one_paragraph_naming_how_to_start_it(fleets):
    write_fleet(a_record("other"))
    with pytest.raises(ConfigError) as caught:
        read_fleet("demo")
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert "no fleet named 'demo'" in message and "running: other" in message
    assert "agrpo fleet up demo +recipe=NAME" in message and str(fleets / "demo.json") in message


def test_a_record_whose_process_is_gone_is_stale(fleets):
    stale = a_record(pid=gone_pid(), pid_start=None)
    write_fleet(stale)
    assert not stale.alive()
    with pytest.raises(StaleFleet) as caught:
        read_fleet("demo")
    assert caught.value.exit_code == 2 and f"its process {stale.pid} is gone" in str(caught.value)
    assert "agrpo fleet status" in str(caught.value)
    assert list_fleets() == ([], [stale], {})


def test_a_reused_pid_is_not_the_fleet(fleets):
    """The pid runs (this test), but it started at another time than the fleet's process did."""
    reused = a_record(pid_start=start_time(os.getpid()) + 1)
    write_fleet(reused)
    assert not reused.alive()
    with pytest.raises(StaleFleet):
        read_fleet("demo")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "is an array, not an object"),
        (b"", "empty"),
        (b'{"name": "demo"}', "has no url, admin_token"),
        (None, "pid is a string, not a number"),
        (None, "names fleet 'other'"),
    ],
)
def test_a_garbage_record_is_one_paragraph_naming_the_file(fleets, content, reason):
    runtime_dir("fleets")  # made as agrpo makes it
    if content is None:
        fields = json.loads(registry.record_bytes(a_record()))
        fields.update({"pid": "1"} if "pid" in reason else {"name": "other"})
        content = json.dumps(fields).encode()
    (fleets / "demo.json").write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        read_fleet("demo")
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    assert message.startswith(f"the record of fleet 'demo' ({fleets / 'demo.json'}) cannot be read: ")
    assert reason in message and "agrpo fleet down demo" in message
    running, stale, bad = list_fleets()
    assert (running, stale, list(bad)) == ([], [], ["demo"]) and bad["demo"] == message


def test_a_planted_link_is_not_followed(fleets, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_bytes(registry.record_bytes(a_record()))
    runtime_dir("fleets")  # made as agrpo makes it
    (fleets / "demo.json").symlink_to(target)
    with pytest.raises(ConfigError) as caught:
        read_fleet("demo")
    assert "cannot be opened" in str(caught.value) and "plain file of yours" in str(caught.value)


def test_names_are_checked_before_any_path_is_made(fleets):
    for bad in ("../x", "Demo", "", "a" * 33):
        with pytest.raises(ConfigError, match="is not valid"):
            read_fleet(bad)
    assert not fleets.exists()


def test_a_fleet_removes_only_its_own_record(fleets):
    write_fleet(a_record())
    assert remove_fleet("demo", pid=os.getpid() + 1) is False  # another fleet process of that name
    assert (fleets / "demo.json").exists()
    assert remove_fleet("demo", pid=os.getpid()) is True


def test_model_identity_compares_folders_by_real_path(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    assert registry.model_identity(str(tmp_path / "link")) == str(folder)
    assert registry.model_identity("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_fleet_that_exited_and_awaits_its_parent_is_gone(fleets):
    """A zombie (exited, not yet reaped by whoever started `agrpo fleet up`) is no running fleet."""
    from agrpo.processes.watchdog import proc_stat

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while (proc_stat(process.pid) or ("Z",))[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not a_record(pid=process.pid, pid_start=None).alive()
    finally:
        process.wait()


def test_one_process_at_a_time_holds_a_fleets_name(fleets):
    held = registry.hold_name("demo")
    try:
        with pytest.raises(ConfigError, match=r"another `agrpo fleet up demo` is starting or running"):
            registry.hold_name("demo")
        os.close(registry.hold_name("other"))  # another name is free
    finally:
        os.close(held)
    os.close(registry.hold_name("demo"))  # free again once its holder let go
    assert stat.S_IMODE(os.lstat(fleets / ".demo.lock").st_mode) == 0o600
    assert registry.fleet_names() == []  # a lock is no record
