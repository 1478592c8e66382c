"""The command the rehearsal tests run: the smoke recipe as HF Jobs with two replicas, rehearsed on this machine, and
where its bucket folder lands. Each test adds only what it varies."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rehearsal_command(root: Path, run_id: str, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "agrpo", "+recipe=smoke", "launcher=hf_jobs", "sync=bucket", "inference.replicas=2",
        "--rehearse", f"launcher.hf_jobs.run_id={run_id}", f"--rehearsal-dir={root}",
        "launcher.hf_jobs.poll_interval_s=2", *overrides,
    ]  # fmt: skip


def rehearsal_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def bucket_run(root: Path, run_id: str) -> Path:
    """The stand-in's folder for `/bucket/<run_id>` (namespace `rehearsal`, bucket `agrpo-runs`)."""
    return root / "buckets" / "rehearsal" / "agrpo-runs" / run_id
