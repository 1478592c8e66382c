"""benchmarks/own_tool_task/sample_calls.py, the reader of what a run's model writes (docs/your_agent.md, "Unparseable
calls"), runs as printed on a task folder: here the tiny model without warm start or adapter, 2 rows, one episode
each, every first turn opened with the call tag. No vLLM. A benchmark measures; this only checks that it still does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "benchmarks" / "own_tool_task"


def test_sample_calls_prints_the_reward_and_the_unparseable_share(tmp_path, monkeypatch, tiny_model_dir):
    from agrpo.cli import expand_recipe_paths
    from agrpo.config.compose import compose_run_config

    for name in ("units.py", "make_data.py", "own_tool.yaml"):
        shutil.copy(TASK / name, tmp_path / name)
    subprocess.run([sys.executable, "make_data.py", "."], cwd=tmp_path, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    argv = ["+recipe=own_tool.yaml", f"model.name_or_path={tiny_model_dir}", "agent.warmstart.enabled=false"]
    argv += ["trainer.max_completion_length=16"]
    cfg = compose_run_config(expand_recipe_paths(argv), output_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    OmegaConf.save(cfg, tmp_path / "run" / "config.yaml")
    script = TASK / "sample_calls.py"
    args = [str(tmp_path), "--adapter", "none", "--rows", "2", "--k", "1", "--force-call", "--examples", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"reward \(numeric_match\) \d\.\d{3} over 2 episodes", done.stdout), done.stdout
    # every first turn opened a call: the untrained model's rarely parse, and each that does not has its reason
    found = re.search(r"unparseable tool calls / replies opening one: (\d+)/(\d+) \(", done.stdout)
    assert found and int(found.group(2)) >= 2 and int(found.group(1)) <= int(found.group(2)), done.stdout
    reasons = re.findall(r"^  (\w+): '<tool_call>", done.stdout, re.M)
    assert set(reasons) <= {"cut", "length", "json", "shape", "other"} and len(reasons) <= 5, done.stdout
