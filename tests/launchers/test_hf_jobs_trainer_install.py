"""The trainer Job's own command, run on this machine: it installs the uploaded wheel and runs the uploaded config.

A stand-in for the Job's container: a folder with its own virtual environment, whose `python3` is the one the
command finds first on PATH, so whatever the command installs lands in that folder, never in the environment that
launched it. The environment sees this one's packages through a .pth file (the image's preinstalled torch,
transformers, TRL), and pip runs with PIP_NO_INDEX=1: nothing is downloaded. The bucket mount is a folder
(`sync.mount_path`), filled through the fake Hub's upload route (Xet cannot be faked, see tests/fakes/fake_hub.py).
"""

import os
import site
import subprocess
import sys
from pathlib import Path

from fakes.fake_hub import FakeHub, use_fake_hub

from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for

REPO = Path(__file__).resolve().parents[2]


def job_container(root: Path) -> Path:
    """A bin/ folder whose python3 is a fresh venv that also sees this environment's packages (the 'image')."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    purelib = next((root / "venv" / "lib").glob("python3*")) / "site-packages"
    (purelib / "image_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python3"  # not a symlink: Python finds its venv from the path it was started by
    wrapper.write_text(f'#!/bin/sh\nexec "{root / "venv" / "bin" / "python"}" "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def test_the_trainer_jobs_command_installs_the_uploaded_wheel_into_the_job_and_runs_the_uploaded_config(
    tmp_path, monkeypatch
):
    bucket, job = tmp_path / "bucket", tmp_path / "job"
    job.mkdir()
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        hub.buckets["alice/agrpo-runs"] = bucket  # the mount: uploads land here
        cfg = spec_for(
            "+recipe=gsm8k",
            "launcher=hf_jobs",
            "sync=bucket",
            "launcher.hf_jobs.run_id=r1",
            "launcher.hf_jobs.namespace=alice",
            f"sync.mount_path={bucket}",
            "lora.alpha=9",
            "launcher.hf_jobs.trainer_flavor=cpu-upgrade",
            "launcher.hf_jobs.install_attempts=1",
            f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
        )
        plan = build_jobs_plan(cfg, launch_id="L1")
        run = JobsRun(plan, make_api(), echo=lambda line: None)
        run.upload()  # what the executor does before any Job: the wheel and the config into the run's folder
        assert (bucket / plan.wheel.path_in_bucket).is_file() and (bucket / plan.config.path_in_bucket).is_file()

        bin_dir = job_container(job)
        python = str(bin_dir / "python3")
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            plan.trainer.env,
            HF_TOKEN=os.environ["HF_TOKEN"],
            PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
            PIP_NO_INDEX="1",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            HOME=str(job),
            HF_HUB_OFFLINE="0",
        )  # a Job is online; the Hub it reaches here is the fake one
        subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True, capture_output=True, env=env)
        done = subprocess.run(plan.trainer.command, env=env, cwd=job, capture_output=True, text=True, timeout=600)

    # pip installed the wheel into the Job's own environment, then the trainer ran from the uploaded config: with
    # no replica Job of launch L1 on the (fake) Hub it stops with its one-line error.
    assert "Successfully installed agrpo-" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    assert "found 0 running replica Job(s) of run r1 (launch L1)" in done.stderr
    where = subprocess.run(
        [python, "-c", "import agrpo, omegaconf; print(agrpo.__file__)"],
        env=env,
        cwd=job,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(job / "venv")) and not where.startswith(str(REPO))
    assert not any(Path(p).name == "site-packages" and (Path(p) / "agrpo").exists() for p in site.getsitepackages())
