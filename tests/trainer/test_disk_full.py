"""A full disk under the run folder (agrpo/trainer/disk_full.py): one paragraph naming the folder, the space the run
needs there and the knobs, instead of 65 lines of chained tracebacks. The message and the cause are pure; the last
test fills a real 512 KiB tmpfs with adapter versions written the way the sync writes them (it needs root to mount:
where it cannot, it fails saying so)."""

from __future__ import annotations

import errno
import re
import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from agrpo.trainer.disk_full import DiskFigures, disk_figures, disk_full_cause, disk_full_message


def full(filename: str | None = "/runs/r/.vllm_lora/.trl-policy-v45.tmp/adapter_model.safetensors") -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", filename)


def test_the_paragraph_names_the_folder_what_it_needs_and_the_knobs():
    figures = DiskFigures("/runs/r", 4096, 164 * 1024, 44, 2 * 1024 * 1024, 2, 2)
    text = disk_full_message(figures, full())
    assert text.startswith("the disk holding the run folder /runs/r is full (4.0 KiB free): No space left on device ")
    assert "writing /runs/r/.vllm_lora/.trl-policy-v45.tmp/adapter_model.safetensors" in text
    # (44 kept + 1 being written) x 164 KiB + (2 kept + 1 being written) x 2 MiB = 7.2 + 6.0 MiB
    assert (
        "needs about 13.2 MiB free there: it keeps 44 adapter versions of 164.0 KiB each in /runs/r/.vllm_lora" in text
    )
    assert "and 2 checkpoints of 2.0 MiB each (trainer.save_total_limit)" in text
    assert "inference.adapter_retention_s" in text and "hydra.run.dir" in text and "\n" not in text


def test_the_cause_is_found_however_deep_or_wrapped():
    try:
        try:
            raise full()
        except OSError as error:
            raise RuntimeError("saving the adapter failed") from error
    except RuntimeError as wrapped:
        assert disk_full_cause(wrapped).errno == errno.ENOSPC
    rust = RuntimeError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')
    assert disk_full_cause(rust) is rust
    assert disk_full_cause(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full_cause(ValueError("no")) is None


def test_the_trainer_reports_a_full_disk_as_its_one_paragraph_and_raises_anything_else(tmp_path, monkeypatch):
    from agrpo.trainer.__main__ import report_disk_full
    from agrpo.trainer.trainer_error import TRAINER_ERROR_ENV

    monkeypatch.setenv(TRAINER_ERROR_ENV, str(tmp_path / "trainer_error.txt"))
    cfg = SimpleNamespace(
        sync=SimpleNamespace(output_dir=str(tmp_path / "run")), trainer=SimpleNamespace(save_total_limit=2)
    )
    try:
        raise RuntimeError("sync failed") from full()
    except RuntimeError as error:
        assert report_disk_full(error, cfg) == 1
    assert (
        (tmp_path / "trainer_error.txt").read_text().startswith(f"the disk holding the run folder {tmp_path / 'run'}")
    )
    with pytest.raises(KeyError):
        report_disk_full(KeyError("other"), cfg)


def mount_problem() -> str | None:
    if os.geteuid() != 0:
        return "it needs root to mount a small tmpfs"
    return None if shutil.which("mount") else "`mount` is not installed"


@pytest.mark.requires(mount_problem())
def test_a_real_full_disk_names_the_folder_and_the_retained_versions(tmp_path):
    import torch
    from peft import LoraConfig

    from agrpo.trainer.sync.snapshot import AdapterSnapshot

    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(run)], check=True)
    try:
        snapshot = AdapterSnapshot({"lora_A.weight": torch.zeros(160, 256)}, LoraConfig(r=8))  # 160 KiB
        raised = None
        for version in range(1, 6):
            try:
                snapshot.write(str(run / ".vllm_lora" / f"trl-policy-v{version}"))
            except Exception as error:  # noqa: BLE001 - whatever safetensors raises for a full disk
                raised = error
                break
        assert raised is not None and version == 4  # three fit in 512 KiB, the fourth does not
        cause = disk_full_cause(raised)
        assert cause is not None
        text = disk_full_message(disk_figures(run, 2), cause)
        assert text.startswith(f"the disk holding the run folder {run} is full (")
        # a version's size as written (its adapter_config.json differs a little between peft versions)
        size = sum(f.stat().st_size for f in (run / ".vllm_lora" / "trl-policy-v1").iterdir()) / 1024
        assert f"it keeps 3 adapter versions of {size:.1f} KiB each in {run}/.vllm_lora" in text, text
        needed = float(re.search(r"needs about ([\d.]+) KiB free there", text)[1])
        assert abs(needed - 4 * size) < 0.5, text  # 3 kept + 1 being written
    finally:
        subprocess.run(["umount", str(run)], check=True)
