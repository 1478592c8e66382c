"""benchmarks/gpu_check.py's parts that run without a GPU: the synthetic rollouts TRL's trainer consumes, and the
whole check falling back to the CPU (tiny preset, fp32 arm: TRL's real trainer on agrpo's SDPA attention), which
prints the table with a measured row and says why the bf16 arms did not run. On a GPU it is untested (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402


def test_synthetic_rollouts_are_groups_sharing_a_prompt_at_the_live_version():
    worker = gpu_check.SyntheticRollouts(gpu_check.PRESETS["tiny"], group=4, tokens=300)
    worker.update_model_version(7)
    worker.start()
    samples = [worker.rollout_buffer.get(timeout=60) for _ in range(8)]
    worker.stop()
    prompt = gpu_check.PRESETS["tiny"]["prompt"]
    assert [s.group_id for s in samples] == [0] * 4 + [1] * 4
    assert all(np.array_equal(s.input_ids[:prompt], samples[0].input_ids[:prompt]) for s in samples[:4])
    assert all(s.model_version == 7 and s.input_ids.max() < 300 for s in samples)
    for s in samples:
        assert len(s.input_ids) == len(s.completion_mask) == len(s.old_log_probs)
        assert s.completion_mask[:prompt].sum() == 0 and s.completion_mask[prompt:].all()
    assert abs(sum(s.advantage for s in samples[:4])) < 1e-6  # group-normalised, as GRPO's advantages are


def test_the_check_falls_back_to_the_cpu_and_prints_one_table(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--steps", "2", "--warmup", "1",
         "--json", str(tmp_path / "rows.json"), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = {row["arm"]: row for row in json.loads((tmp_path / "rows.json").read_text())}
    assert rows["fa3-bf16"]["skipped"] == rows["sdpa-bf16"]["skipped"] == "bf16 arms run on a GPU only"
    measured = rows["sdpa-fp32"]
    assert measured["steps_measured"] == 2 and measured["loss_finite"] is True
    assert measured["perf/step_s"] > 0 and measured["perf/trained_tok_s_wall_clock"] > 0
    assert "SDPA packed attention" in measured["attention"]
    table = result.stdout.splitlines()
    assert table[1].split()[:3] == ["arm", "steps/s", "trained"] and len(table) == 6
