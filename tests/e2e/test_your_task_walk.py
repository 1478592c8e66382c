"""docs/your_task.md, walked with its own commands as printed, and the commands the run's summary prints, as printed.

What the test adds to a printed command, always at its end and never changing what is printed: the session's vLLM
server and its copy of the tiny model (role=trainer inference.urls=[...] model.name_or_path=... model.builder=null,
so no test starts another replica) and a shorter run (trainer.max_steps, eval.max_problems) to fit CI. The Hub is a
fake one (tests/report/fake_model_hub.py): the real one cannot be reached from here.

What it proves: the page's data script, recipe and commands work in that order from the task folder
(`+recipe=my_task.yaml` included); the run's summary prints one ending whose evaluate, plot and share commands run
as printed; the adapter's evaluation lands where `agrpo push` reads it (the card shows both evaluations); the page's
`RUN=$(...)` idiom finds the run that finished, not the dry run (which leaves no folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report.fake_model_hub import FAKE_TOKEN, NAMESPACE, FakeModelHub

from agrpo.inference.vllm_server import unload_adapters
from tests.docs.guide import code_blocks, commands, recipe, with_args
from tests.tensorboard_tags import tensorboard_tags

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def shell(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`command` in bash, as a reader pastes it, with this Python's bin first on PATH (python, agrpo)."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1", **env},
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def summary_command(output: str, label: str) -> str:
    """The command the run's summary printed after `label` ("evaluate", "plot", "share")."""
    line = next(line for line in output.splitlines() if line.startswith(f"  {label} "))
    return line.split(None, 1)[1]


def test_the_guide_and_the_summary_run_as_printed(vllm_server, tiny_model_dir, tmp_path, run_token):
    server = [
        "role=trainer",
        f"inference.urls=[{vllm_server.url}]",
        f"model.name_or_path={tiny_model_dir}",
        "model.builder=null",
    ]
    shell(code_blocks("bash")[0], tmp_path)  # mkdir my_task && cd my_task && python - <<'EOF' ...
    task = tmp_path / "my_task"
    (task / "my_task.yaml").write_text(recipe())
    [dry_run, composed] = commands("python -m agrpo +recipe=my_task.yaml ")
    assert "[replica] vllm-0" in shell(dry_run, task).stdout
    assert "run_name: my_task" in shell(composed, task).stdout
    assert not (task / "outputs").exists()  # the dry run left no run folder behind

    [train] = [c for c in commands("python -m agrpo +recipe=my_task.yaml") if c not in (dry_run, composed)]
    try:
        trained = shell(with_args(train, *server, "trainer.max_steps=3"), task)
        output = trained.stdout + trained.stderr
        endings = [line for line in output.splitlines() if line.startswith("agrpo: ")]
        assert len(endings) == 2 and endings[1].startswith("agrpo: done, 3 steps, final adapter in ")  # banner + end
        assert "Child did not exit" not in output and "WARNING" not in output  # the rollout process ended at once
        [find_run] = commands("RUN=")
        run_dir = (task / shell(f"{find_run}\necho $RUN", task).stdout.split()[-1]).resolve()
        assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
        assert {"train/reward", "train/rewards/numeric_match", "train/rewards/regex_match"} <= tensorboard_tags(run_dir)

        evaluate = summary_command(output, "evaluate")
        assert "+recipe=my_task.yaml" in evaluate and evaluate.endswith(f"eval.adapter={run_dir}/final_adapter")
        shell(with_args(evaluate, f"inference.urls=[{vllm_server.url}]", "eval.max_problems=4"), task)
        [from_summary] = list((run_dir / "eval").glob("*/eval_summary.json"))
        for line in commands("agrpo eval "):
            shell(f"{find_run}\n{with_args(line, *server, 'eval.max_problems=4')}", task)
    finally:
        unload_adapters(vllm_server.url)
    assert len(list((run_dir / "eval").glob("*/eval_summary.json"))) == 2  # the summary's and the page's
    assert json.loads((task / "base_eval" / "eval_summary.json").read_text())["adapter"] is None
    assert json.loads(from_summary.read_text())["adapter"] == f"{run_dir}/final_adapter"

    shell(summary_command(output, "plot"), task)
    assert (run_dir / "training_curves.png").is_file() and (run_dir / "training_curves-2.png").is_file()
    [overlay] = commands("agrpo plot ")
    shell(overlay, task)
    assert (task / "my_task_runs.png").is_file()

    card = shell(summary_command(output, "share"), task).stdout
    assert "python -m agrpo +recipe=my_task.yaml role=trainer" in card and "| this adapter | 4 |" in card
    [dry_push, push] = commands("agrpo push ")
    card = shell(f"{find_run}\n{dry_push}", task).stdout
    assert "| base model | 4 |" in card and card.count("| this adapter | 4 |") == 2
    with FakeModelHub() as hub:
        env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url, "HF_TOKEN": FAKE_TOKEN, "NO_PROXY": "127.0.0.1"}
        shell(f"{find_run}\n{push}", task, **env)
        files = hub.repos[f"{NAMESPACE}/my-task-lora"].files
    assert "| base model | 4 |" in files["README.md"].decode()
    assert files["adapter_model.safetensors"] == (run_dir / "final_adapter" / "adapter_model.safetensors").read_bytes()
