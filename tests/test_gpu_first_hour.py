"""benchmarks/gpu_first_hour.py (`make gpu-check`) without a GPU: its steps planned for simulated machines by agrpo's
GPU planner, the figures read from a run folder, the table and its place in docs/gpu.md, and `--dry-run`. The runs
themselves need a GPU: untested here (docs/gpu.md says so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_first_hour as check  # noqa: E402

from tests.config.test_gpu_plan_topologies import MACHINES, QWEN2_5_0_5B  # noqa: E402


def steps_of(machine: str) -> dict[str, check.Step]:
    return {step.name: step for step in check.plan(MACHINES[machine], QWEN2_5_0_5B, "/data/gsm8k/train.jsonl")}


def test_one_80_gb_gpu_runs_gsm8k_as_shipped_and_two_replicas_beside_the_trainer_with_advice():
    steps = steps_of("1x80GB")
    assert list(steps) == ["demo", "gsm8k", "fa3", "sdpa", "2 replicas"]
    assert steps["demo"].overrides == ["+recipe=smoke"] and steps["demo"].env == {"HF_HUB_OFFLINE": "1"}
    assert steps["gsm8k"].note == "" and "trainer.max_steps=20" in steps["gsm8k"].overrides
    assert "data.path=/data/gsm8k/train.jsonl" in steps["gsm8k"].overrides
    two = steps["2 replicas"]
    assert {"inference.replicas=2", "inference.gpus=[0,0]", "trainer.gpus=[0]"} <= set(two.overrides)
    assert two.note.startswith("with the planner's advice: trainer.gradient_checkpointing=true")
    assert "trainer.attention=fa3" in steps["fa3"].overrides and "trainer.attention=sdpa" in steps["sdpa"].overrides


def test_a_24_gb_gpu_runs_gsm8k_with_the_settings_the_planner_offers():
    steps = steps_of("1x24GB")
    advice = steps["gsm8k"].note.removeprefix("with the planner's advice: ")
    assert advice != steps["gsm8k"].note and advice.split() == steps["gsm8k"].overrides[-len(advice.split()) :]
    assert all(advice in " ".join(steps[name].overrides) for name in ("fa3", "sdpa"))


def test_eight_gpus_give_each_replica_its_own():
    two = steps_of("8x80GB")["2 replicas"]
    assert two.note == "" and not any(o.startswith(("inference.gpus", "trainer.gpus")) for o in two.overrides)


def test_the_figures_come_from_the_runs_own_files(tmp_path):
    steps = [{"perf/step_s": s} for s in (9.0, 8.0, 2.0, 2.0, 2.0)]  # two warm-up steps left out
    (tmp_path / "log_history.json").write_text(json.dumps(steps))
    (tmp_path / "metrics.json").write_text(json.dumps({"reward_last": 0.41}))
    log = "x\nattention    FA3 (kernels-community/flash-attn3, loaded)\n"
    assert check.figures(tmp_path, log) == {
        "steps_per_s": 0.5,
        "attention": "FA3 (kernels-community/flash-attn3, loaded)",
        "reward_last": 0.41,
    }


def test_the_table_goes_between_the_docs_markers(tmp_path):
    rows = [{"step": "gsm8k", "ok": True, "wall_s": 95.0, "steps_per_s": 0.5, "attention": "FA3",
             "peak_gib": {0: 60.1}, "planned_gib": {0: 64.2}, "note": ""}]  # fmt: skip
    text = check.table(MACHINES["1x80GB"], rows)
    assert "| gsm8k | yes | 95.0 | 0.5 | FA3 | 0: 60.1 | 0: 64.2 |  |" in text
    doc = tmp_path / "gpu.md"
    doc.write_text(f"before\n{check.BEGIN}\nold\n{check.END}\nafter\n")
    check.into_doc(doc, text)
    assert doc.read_text() == f"before\n{check.BEGIN}\n{text}{check.END}\nafter\n"
    assert check.BEGIN in (REPO / "docs" / "gpu.md").read_text()  # where `make gpu-check --doc docs/gpu.md` writes


def test_the_dry_run_prints_each_command_on_any_machine():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # no estimate offline: the planner checks the placement only
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_first_hour.py"), "--dry-run", "--simulate", "1x80"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("(no memory estimate: Qwen/Qwen2.5-0.5B-Instruct's config.json")
    assert lines[1].startswith("demo: python -m agrpo +recipe=smoke trainer.save_steps=0 hydra.run.dir=")
    assert any(line.startswith("2 replicas: python -m agrpo +recipe=gsm8k") for line in lines)
