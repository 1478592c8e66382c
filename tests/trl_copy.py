"""A copy of the installed trl package with one name changed, first on the path of an agrpo command run as a user
runs it (tests/trainer/test_trl_compat.py, tests/launchers/test_hf_jobs_trl_check.py): the held-out check that a
renamed private TRL name stops a run before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from agrpo.trl_compat import trl_root

REPO = Path(__file__).resolve().parents[1]
TRAINER = "experimental/async_grpo/async_grpo_trainer.py"
EDITS = {  # id -> (file, old, new, what the error must name)
    "sync_weight_lora": (TRAINER, "_sync_weight_lora", "_sync_adapter", "AsyncGRPOTrainer._sync_weight_lora is gone"),
    "rollout_hook": (
        TRAINER,
        "        rollout_worker: RolloutWorkerProtocol | None = None,",
        "        rollout_backend: RolloutWorkerProtocol | None = None,",
        "AsyncGRPOTrainer.__init__ no longer takes rollout_worker",
    ),
    "checkpoint_hook": (
        TRAINER,
        "def _save_checkpoint(self, model, trial)",
        "def _save_checkpoint(self, model)",
        "_save_checkpoint now takes (model)",
    ),
    "flash_attn": ("experimental/async_grpo/packing.py", "_flash_attn", "_load_fa3", "packing._flash_attn is gone"),
    "parse_response": (
        "chat_template_utils.py",
        "    tools: list[dict | Callable] | None = None,\n) -> dict:",
        "    tool_schemas: list[dict | Callable] | None = None,\n) -> dict:",
        "trl.chat_template_utils.parse_response now takes (tokenizer, ids, prefix, tool_schemas)",
    ),
    "lora_dir_attribute": (TRAINER, "self._lora_dir =", "self._adapter_dir =", "AsyncGRPOTrainer._lora_dir is gone"),
}


def copy_trl(site: Path) -> Path:
    """A copy of the installed trl package in `site` (put `site` first on PYTHONPATH to import it)."""
    target = site / "trl"
    shutil.copytree(trl_root(), target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert old in text, f"{relative} no longer holds {old!r}: pick another edit"
    path.write_text(text.replace(old, new))


def changed_trl(site: Path, name: str) -> Path:
    """A copy of the installed trl in `site` with EDITS[name] made."""
    relative, old, new, _ = EDITS[name]
    target = copy_trl(site)
    edit(target, relative, old, new)
    return target


def run_agrpo(args: list[str], trl_copy: Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    """`python -m agrpo ARGS` with `trl_copy` first on the path, in its own process group (its pid); returns
    (the completed process, the pids still in that group once it ended)."""
    env = dict(env or os.environ)
    paths = [str(trl_copy.parent), str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    env.update(PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"))
    env.pop("AGRPO_DEBUG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "agrpo", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        left = group_members(process.pid)
        if process.poll() is None or left:
            try:
                os.killpg(process.pid, 9)  # the test fails on `left`; nothing outlives it
            except ProcessLookupError:
                pass
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), left


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (read from /proc: field 5 of /proc/PID/stat)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
