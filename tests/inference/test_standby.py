"""Standby spares (inference.fleet.standby): the vLLM names the standby relies on exist in the installed vLLM (an
upgrade that moves one fails here, not in a run), and a standby waits until it is added, then runs its server module
with its arguments; without a standby the same process runs it at once. Real processes with a stand-in server module
(tests/inference/standby_standin.py); the real vLLM standby runs in tests/e2e/test_elastic.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from agrpo.inference.standby import STANDBY_MODULE, missing_names
from agrpo.launchers.standby_spare import StandbyProcess
from tests.processes import wait_for

REPO = Path(__file__).resolve().parents[2]
STANDIN = "tests.inference.standby_standin"


def test_the_installed_vllm_has_every_name_the_standby_relies_on():
    assert missing_names() == []


def spare(tmp_path: Path) -> tuple[StandbyProcess, Path]:
    out = tmp_path / "served.json"
    argv = [sys.executable, "-m", STANDBY_MODULE, STANDIN, str(out), "--port", "8101"]
    process = StandbyProcess(
        "vllm-1", argv, {"PYTHONPATH": str(REPO)}, tmp_path / "vllm-1.log", None, go_path=tmp_path / "fleet/vllm-1.go"
    )
    return process, out


def served(path: Path) -> dict:
    """What the stand-in server was given, once it wrote it."""
    wait_for(path.exists, 30, f"the stand-in server to write {path.name}", poll_s=0.05)
    return json.loads(path.read_text())


def test_a_standby_waits_until_added_then_serves_with_its_arguments(tmp_path):
    process, out = spare(tmp_path)
    process.stand_by()
    try:
        log_path = tmp_path / "vllm-1.log"
        wait_for(lambda: "holding no device" in log_path.read_text(), 30, "the standby's imports", poll_s=0.05)
        time.sleep(0.5)
        assert process.standing_by() and not out.exists()  # imported, waiting
        process.start()  # the go
        given = served(out)
        assert given["rest"] == ["--port", "8101"] and given["argv"][0].endswith("standby_standin.py")
        assert given["go_env"] is None  # the server (and vLLM's engine core) must not wait in turn
        assert process.wait() == 0 and not process.standing_by()
        log = (tmp_path / "vllm-1.log").read_text()
        assert log.index("holding no device") < log.index("agrpo standby: added; the server starts")
    finally:
        process.stop(timeout_s=5)


def test_without_a_standby_the_spare_starts_cold_and_serves_at_once(tmp_path):
    process, out = spare(tmp_path)
    process.start()
    try:
        assert served(out)["rest"] == ["--port", "8101"]
        assert process.wait() == 0 and "holding no device" not in (tmp_path / "vllm-1.log").read_text()
    finally:
        process.stop(timeout_s=5)


def test_a_standby_that_ended_is_replaced_by_a_cold_start(tmp_path):
    process, out = spare(tmp_path)
    process.stand_by()
    os.killpg(process.pid, signal.SIGKILL)  # e.g. killed while it waited
    process.popen.wait()
    assert process.waiting and not process.standing_by()
    process.start()
    try:
        assert served(out)["rest"] == ["--port", "8101"]
    finally:
        process.stop(timeout_s=5)
