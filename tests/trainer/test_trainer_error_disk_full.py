"""A full disk under the run folder, for real: a tiny tmpfs mounted there and filled to 0 bytes free (root is needed
to mount: where it cannot, the test fails saying so). The trainer's paragraph is never an empty trainer_error.txt
(it goes to a private folder with room, with its traceback, and the launcher reads it there), and the trainer's
console gets at most one line: no traceback from TensorBoard's writer thread, from `log`, or from trainer.log."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agrpo.trainer.trainer_error import (
    TRAINER_ERROR_ENV,
    clear_trainer_error,
    report_trainer_error,
    spill_dir,
    spill_file,
    trainer_error_file,
    trainer_failure,
)
from tests.trainer.test_disk_full import mount_problem


@pytest.fixture
def full_run(tmp_path):
    """A run folder on a 64 KiB tmpfs with 0 bytes free (a filler file took the rest)."""
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(run)], check=True)
    try:
        (run / "logs").mkdir()
        yield run
    finally:
        subprocess.run(["umount", str(run)], check=True)


def fill(run: Path) -> None:
    with (run / "filler").open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"x" * 4096)
        except OSError:
            pass
    assert os.statvfs(run).f_bavail == 0


@pytest.mark.requires(mount_problem())
def test_the_paragraph_goes_where_there_is_room_and_the_launcher_shows_it(full_run, monkeypatch):
    error_file = trainer_error_file(full_run)
    monkeypatch.setenv(TRAINER_ERROR_ENV, str(error_file))
    clear_trainer_error(full_run)
    fill(full_run)
    try:
        (full_run / "adapter.bin").write_bytes(b"y" * 8192)  # a real ENOSPC from the full tmpfs
    except OSError as error:
        assert error.errno == 28
        report_trainer_error("the disk holding the run folder X is full.")
    assert not error_file.exists()  # whole or not at all: never the 0-byte file of before
    assert not [p for p in (full_run / "logs").iterdir()]  # no half-written temporary left either
    folder = spill_dir()
    assert folder is not None and stat.S_IMODE(folder.stat().st_mode) == 0o700
    traced = spill_file(error_file, ".traceback.txt")
    assert "OSError: [Errno 28] No space left on device" in traced.read_text()
    text = trainer_failure(full_run, 1)
    assert text.startswith("the disk holding the run folder X is full. The trainer exited with code 1; ")
    assert text.endswith(f"(its disk was full; traceback: {traced})") and "\n" not in text
    clear_trainer_error(full_run)  # the next attempt does not show this one's paragraph
    assert not spill_file(error_file).exists() and not traced.exists()


CHILD = textwrap.dedent(
    """
    import logging, sys
    from types import SimpleNamespace
    from agrpo.trainer.console.logs import setup_trainer_logging
    from agrpo.trainer.disk_full_quiet import install_thread_hook, on_disk_full
    from agrpo.trainer.__main__ import report_disk_full
    from torch.utils.tensorboard import SummaryWriter

    run = sys.argv[1]
    setup_trainer_logging(run, "INFO")
    install_thread_hook()  # as AgrpoAsyncGRPOTrainer.__init__ does
    writer = SummaryWriter(run + "/tensorboard")
    with open(run + "/filler", "wb", buffering=0) as out:  # the disk fills while the trainer runs
        try:
            while True:
                out.write(b"x" * 4096)
        except OSError:
            pass
    try:
        for step in range(1000):  # TensorBoard's callback at each log, as in seam/trainer.py `log`
            writer.add_scalar("train/reward", 0.5, step)
            writer.flush()
    except OSError as error:
        on_disk_full(error, "main")  # what AgrpoAsyncGRPOTrainer.log does before the error reaches __main__
        for step in range(5):
            logging.getLogger("transformers.trainer").info("a record trainer.log cannot take %d", step)
        cfg = SimpleNamespace(sync=SimpleNamespace(output_dir=run), trainer=SimpleNamespace(save_total_limit=2))
        sys.exit(report_disk_full(error, cfg))
    """
)


@pytest.mark.requires(mount_problem())
def test_a_trainer_meeting_a_full_disk_prints_no_traceback(full_run, tmp_path):
    env = {**os.environ, TRAINER_ERROR_ENV: str(trainer_error_file(full_run)), "HF_HUB_OFFLINE": "1"}
    clear_trainer_error(full_run)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(full_run)], env=env, capture_output=True, text=True, timeout=120
    )
    console = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr, done.stderr
    assert len(console) <= 1, console  # before: TensorBoard's thread traceback, then the main thread's
    text = trainer_failure(full_run, 1)
    assert text.startswith(f"the disk holding the run folder {full_run} is full (0 bytes free): No space left"), text
    assert "its disk was full; traceback: " in text
    thread = spill_file(trainer_error_file(full_run), ".thread.traceback.txt")
    assert "OSError: [Errno 28]" in thread.read_text()
    clear_trainer_error(full_run)
    assert not thread.exists()


@pytest.mark.requires(mount_problem())
def test_trainer_log_on_a_full_disk_says_so_once(full_run, capsys):
    import logging

    from agrpo.trainer.disk_full_quiet import QuietFileHandler

    handler = QuietFileHandler(full_run / "logs" / "trainer.log", encoding="utf-8")
    fill(full_run)
    try:
        for step in range(1000):  # the page the file already has takes a few; then every write fails
            handler.emit(logging.LogRecord("transformers.trainer", logging.INFO, "x", 1, "step %d", (step,), None))
    finally:
        handler.close()
        logging.raiseExceptions = True  # on_disk_full switched it off for this process
        clear_trainer_error(full_run)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"agrpo trainer: {full_run}/logs/trainer.log: the disk is full; no more lines are written there"
    ]


def test_the_exit_waits_for_a_thread_still_keeping_its_traceback(tmp_path, monkeypatch):
    """CI once read an empty .thread.traceback.txt: the main thread exited while TensorBoard's thread was writing it.
    Now the write is whole or nothing, and the main thread's exit path waits (bounded) for a hook in flight."""
    import errno
    import logging
    import threading
    import time

    from agrpo.trainer import disk_full_quiet

    monkeypatch.setenv(TRAINER_ERROR_ENV, str(trainer_error_file(tmp_path)))
    entered, slow_write = threading.Event(), disk_full_quiet.on_disk_full

    def slow(error, where):
        entered.set()
        time.sleep(0.5)  # a write the exit would cut short
        slow_write(error, where)

    monkeypatch.setattr(disk_full_quiet, "on_disk_full", slow)
    monkeypatch.setattr(threading, "excepthook", disk_full_quiet.thread_hook)
    monkeypatch.setattr(logging, "raiseExceptions", True)  # on_disk_full switches it off for the process

    def writer():
        raise OSError(errno.ENOSPC, "No space left on device")

    worker = threading.Thread(target=writer, daemon=True)
    worker.start()
    assert entered.wait(5)
    traced = spill_file(trainer_error_file(tmp_path), ".thread.traceback.txt")
    assert disk_full_quiet.settle_thread_hooks(timeout=5)
    assert "OSError: [Errno 28] No space left on device" in traced.read_text()
    clear_trainer_error(tmp_path)
    assert not traced.exists()
