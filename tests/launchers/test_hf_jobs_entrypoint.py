"""`python -m agrpo ... launcher=hf_jobs` end to end against a fake Hub (the real one cannot be reached from here).

The whole command path runs in a child process: Hydra composition, validation, the namespace lookup, the wheel
build and the uploads (sent to the fake Hub as plain HTTP: tests/fakes/child/sitecustomize.py, because Xet cannot
be faked), the replica Jobs, readiness through the exposed URLs, the trainer Job, log streaming, cancellation.
"""

import os
import subprocess
import sys
from pathlib import Path

from fakes.fake_hub import FAKE_TOKEN, FakeHub, trainer_completes
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
CHILD_PATCH = REPO / "tests" / "fakes" / "child"


def child_env(hub):
    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": FAKE_TOKEN,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "FAKE_HUB_UPLOADS": "1",
        "PYTHONPATH": os.pathsep.join([str(CHILD_PATCH), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


finishing_trainer = trainer_completes("trainer: done, 4 steps")


def test_python_m_agrpo_launches_the_run_and_the_trainer_job_runs_the_uploaded_wheel_and_config(tmp_path):
    recipes = tmp_path / "mine"
    recipes.mkdir()
    (recipes / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /recipe/gsm8k\nrun_name: mine\nlora:\n  alpha: 3\n"
    )
    with FakeHub(on_create=finishing_trainer) as hub:
        user = [
            f"+recipe={recipes / 'mine.yaml'}",
            "launcher=hf_jobs",
            "sync=bucket",
            "inference.replicas=2",
            "lora.r=1",
            "launcher.hf_jobs.run_id=cli1",
            f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
            "launcher.hf_jobs.poll_interval_s=0.01",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "agrpo", *user, f"hydra.run.dir={tmp_path / 'out'}"],
            env=child_env(hub),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer: done, 4 steps" in done.stdout
    logs = "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert "prepare: upload the resolved run config" in logs  # the plan went to the run's log
    assert FAKE_TOKEN not in done.stdout + done.stderr + logs
    assert hub.calls("GET", "/api/whoami-v2")  # the namespace came from the token
    replica0, replica1, trainer = hub.created()
    ids = list(hub.jobs)
    assert replica0["command"][replica0["command"].index("--max-lora-rank") + 1] == "1"
    uploaded = hub.uploads["alice/agrpo-runs"]
    wheel = next(path for path in uploaded if path.endswith(".whl"))
    assert trainer["command"][4:] == [
        f"/bucket/{wheel}",
        "trl[kernels]==1.16.*",
        "--",
        "python3",
        "-m",
        "agrpo.launchers.hf_jobs.trainer",
        "/bucket/cli1/config.yaml",
    ]
    job_cfg = OmegaConf.create(uploaded["cli1/config.yaml"].decode())
    # The user's recipe file and overrides reach the Job as values, not as overrides it would re-compose.
    assert (job_cfg.run_name, job_cfg.lora.alpha, job_cfg.lora.r, job_cfg.sync.bucket) == (
        "mine",
        3,
        1,
        "alice/agrpo-runs",
    )
    assert sorted(hub.cancelled()) == sorted(ids[:2])
    assert FAKE_TOKEN.encode() not in b"".join(uploaded.values())


def test_an_interpolated_secret_is_refused_before_any_job_and_never_printed(tmp_path):
    with FakeHub() as hub:
        user = [
            "+recipe=gsm8k",
            "launcher=hf_jobs",
            "sync=bucket",
            "launcher.hf_jobs.run_id=cli2",
            "inference.extra_args=[--api-key,'${oc.env:HF_TOKEN}']",
        ]
        for extra in ([], ["launcher.dry_run=true"]):
            done = subprocess.run(
                [sys.executable, "-m", "agrpo", *user, *extra, f"hydra.run.dir={tmp_path}"],
                env=child_env(hub),
                capture_output=True,
                text=True,
                timeout=300,
                cwd=tmp_path,
            )
            assert done.returncode == 2, done.stderr[-2000:]
            assert (
                "inference.extra_args[1] reads the secret HF_TOKEN" in done.stderr
                and "launcher.hf_jobs.secrets" in done.stderr
            )
            assert "Traceback" not in done.stderr
            logs = "".join(p.read_text() for p in tmp_path.rglob("*.log"))
            assert FAKE_TOKEN not in done.stdout + done.stderr + logs
    assert hub.created() == [] and hub.uploads == {}
