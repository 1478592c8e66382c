"""The stand-in Hub is as strict as the real one, and agrpo refuses the same things first.

One stand-in of the Hub API (agrpo/rehearsal/hub_api.py) serves the rehearsal and the tests' fake
Hub (tests/fakes/fake_hub.py): both are checked here, through huggingface_hub's own HfApi, for the token on every
route and for what the Jobs API refuses (flavors that are not huggingface_hub's hardware names, labels outside the
Hub's tag alphabet, a bucket volume whose bucket does not exist). The rehearsal's backend is built without starting
any Job (no root needed: every request here is refused before a Job would start). Then agrpo's validation: each of
these is refused in the dry run, exit 2 naming the key, before anything is uploaded.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from fakes.fake_hub import FAKE_TOKEN, FakeHub, trainer_completes, use_fake_hub

from agrpo.cli import run
from agrpo.config.compose import compose_run_config
from agrpo.config.hf_jobs_checks import hf_jobs_problems, job_flavors
from agrpo.errors import ConfigError, LaunchError
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from agrpo.rehearsal.hub_api import FILES_ROUTE
from agrpo.rehearsal.plain_transfer import plain_transfer_api
from agrpo.rehearsal.server import Listeners
from agrpo.rehearsal.standin import StandIn
from tests.specs import spec_for

REPO = Path(__file__).resolve().parents[2]
BASE = ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"]


class Served:
    """A stand-in Hub (url, token, namespace) and an HfApi that talks to it with the right token."""

    def __init__(self, url: str, token: str, namespace: str):
        from huggingface_hub import HfApi

        self.url, self.token, self.namespace = url, token, namespace
        self.api = plain_transfer_api(HfApi)(endpoint=url, token=token)


@pytest.fixture(params=["fake_hub", "rehearsal"])
def hub(request, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the stand-in is on this machine
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    if request.param == "fake_hub":
        with FakeHub() as fake:
            yield Served(fake.url, FAKE_TOKEN, fake.namespace)
        return
    stand_in = StandIn(tmp_path / "rehearsal", "carol", "hf_rehearsal_token_for_this_test")
    listeners = Listeners(stand_in)
    listeners.start()
    try:
        yield Served(stand_in.api_url, stand_in.token, stand_in.namespace)
    finally:
        listeners.stop()


def routes(ns: str) -> list[tuple[str, str]]:
    return [
        ("GET", "/api/whoami-v2"),
        ("GET", "/api/jobs/hardware"),
        ("POST", f"/api/jobs/{ns}"),
        ("GET", f"/api/jobs/{ns}"),
        ("GET", f"/api/jobs/{ns}/0123/logs"),
        ("POST", f"/api/jobs/{ns}/0123/cancel"),
        ("POST", f"/api/buckets/{ns}/b"),
        ("GET", f"/api/buckets/{ns}/b/tree"),
        ("PUT", f"/{FILES_ROUTE}/{ns}/b/x"),
        ("GET", f"/{FILES_ROUTE}/{ns}/b/x"),
    ]


def test_every_api_route_needs_the_token(hub):
    for method, path in routes(hub.namespace):
        for headers in ({}, {"Authorization": "Bearer hf_wrong"}):
            answer = requests.request(method, hub.url + path, headers=headers, timeout=10, json={})
            assert answer.status_code == 401, (method, path, headers, answer.text)
    assert hub.api.whoami()["name"] == hub.namespace  # and the right token is accepted


def job(hub, **changes):
    from huggingface_hub import Volume

    kwargs = dict(image="img", command=["true"], flavor="cpu-basic", namespace=hub.namespace, labels={"a": "b"})
    kwargs.update(changes)
    if "bucket" in kwargs:
        kwargs["volumes"] = [Volume(type="bucket", source=kwargs.pop("bucket"), mount_path="/bucket")]
    return hub.api.run_job(**kwargs)


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"flavor": "h100x1"}, "unknown flavor 'h100x1'"),
        ({"labels": {"team": "r.l"}}, "label team='r.l'"),
        ({"bucket": "{ns}/missing"}, "bucket {ns}/missing does not exist"),
        ({"timeout": -5}, "timeoutSeconds=-5 must be a positive integer"),
        ({"attempts": 0}, "attempts=0 must be a positive integer"),
    ],
)
def test_what_the_jobs_api_refuses_is_refused_with_the_reason(hub, changes, why):
    from huggingface_hub.errors import HfHubHTTPError

    changes = {k: v.format(ns=hub.namespace) if isinstance(v, str) else v for k, v in changes.items()}
    with pytest.raises(HfHubHTTPError) as refused:
        job(hub, **changes)
    assert refused.value.response.status_code == 400 and why.format(ns=hub.namespace) in str(refused.value)


def test_other_namespaces_are_forbidden_and_run_job_refuses_a_second_name(hub):
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError, match="403"):
        job(hub, namespace="someone-else")
    with pytest.raises(HfHubHTTPError, match="403"):
        hub.api.create_bucket("someone-else/b")
    with pytest.raises(ValueError, match="`name` and the `name` key in `labels`"):  # huggingface_hub's own check
        job(hub, name="x", labels={"name": "y"})


def test_a_job_that_passes_every_rule_is_accepted_by_the_fake_hub(monkeypatch):
    with FakeHub() as fake:
        use_fake_hub(monkeypatch, fake)
        served = Served(fake.url, FAKE_TOKEN, fake.namespace)
        served.api.create_bucket(f"{fake.namespace}/b")
        info = job(served, bucket=f"{fake.namespace}/b", timeout=60, attempts=2)
    assert info.status.stage == "RUNNING" and fake.created()[0]["flavor"] == "cpu-basic"


def test_the_flavor_list_is_huggingface_hubs():
    from huggingface_hub import JobHardware

    assert job_flavors() == [flavor.value for flavor in JobHardware] and "h200" in job_flavors()
    assert "h100x1" not in job_flavors()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("launcher.hf_jobs.replica_flavor=h100x1", "launcher.hf_jobs.replica_flavor='h100x1' is not a Jobs flavor"),
        ("launcher.hf_jobs.trainer_flavor=a100", "launcher.hf_jobs.trainer_flavor='a100' is not a Jobs flavor"),
        ("+launcher.hf_jobs.labels.name=mine", "launcher.hf_jobs.labels.name: agrpo sets the 'name' label"),
        ("+launcher.hf_jobs.labels.agrpo-run=x", "launcher.hf_jobs.labels.agrpo-run: agrpo sets"),
        ("launcher.hf_jobs.replica_timeout_s=0", "launcher.hf_jobs.replica_timeout_s=0 must be >= 1"),
        ("launcher.hf_jobs.replica_flavor=cpu-upgrade", "replica_flavor=cpu-upgrade has no GPU: set inference.device"),
    ],
)
def test_agrpo_refuses_each_first_in_the_dry_run_naming_the_key(override, fragment, capsys):
    assert any(fragment in p for p in hf_jobs_problems(compose_run_config([*BASE, override]))), fragment
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace(".", r"\.")):
        run(compose_run_config([*BASE, override, "launcher.dry_run=true"]))
    assert capsys.readouterr().out == ""  # nothing planned, nothing printed


def test_cpu_flavors_plan_cpu_replicas():
    on_cpu = [
        "launcher.hf_jobs.replica_flavor=cpu-upgrade",
        "launcher.hf_jobs.trainer_flavor=cpu-upgrade",
        "inference.device=cpu",
    ]
    assert hf_jobs_problems(compose_run_config([*BASE, *on_cpu])) == []
    plan = build_jobs_plan(spec_for(*BASE, *on_cpu))
    assert "--distributed-executor-backend" in plan.replicas[0].command and "--dtype" in plan.replicas[0].command
    assert "trl[kernels]==1.16.*" not in plan.trainer.command


def test_the_cli_exits_2_naming_every_refused_key_before_any_upload(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agrpo",
            *BASE,
            "launcher.hf_jobs.replica_flavor=h100x1",
            "+launcher.hf_jobs.labels.name=mine",
            f"hydra.run.dir={tmp_path}",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_TOKEN": FAKE_TOKEN, "HF_ENDPOINT": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "launcher.hf_jobs.replica_flavor='h100x1'" in done.stderr and "launcher.hf_jobs.labels.name" in done.stderr
    assert "Traceback" not in done.stderr and FAKE_TOKEN not in done.stderr


def test_a_refused_job_creation_is_one_line_and_cancels_what_was_launched(monkeypatch):
    """A plan built around the validation pass (an API user) with a label run_job refuses: no traceback."""
    with FakeHub(on_create=trainer_completes("done")) as fake:
        use_fake_hub(monkeypatch, fake)
        cfg = spec_for(
            *BASE,
            "launcher.hf_jobs.namespace=alice",
            "launcher.hf_jobs.install='agrpo==0.1.0'",
            f"launcher.hf_jobs.replica_url='{fake.replica_url_template()}'",
            "launcher.hf_jobs.poll_interval_s=0.01",
        )
        plan = build_jobs_plan(cfg, launch_id="L1")
        plan.trainer.labels["name"] = "mine"
        from agrpo.launchers.hf_jobs.client import make_api

        with pytest.raises(LaunchError) as error:
            JobsRun(plan, make_api(), echo=lambda line: None).execute()
    message = str(error.value)
    assert message.startswith("the Jobs API refused the trainer Job run1-trainer (ValueError: `name` and the")
    assert "every Job of run run1 was cancelled" in message and "\n" not in message
    assert fake.cancelled() == list(fake.jobs)[:1]  # the replica it had launched


def test_the_trainer_job_does_not_recheck_the_replicas_device():
    """The replicas' device against their flavor is the launching machine's check (role=all, before any Job starts);
    the trainer Job (role=trainer) reads the uploaded config, whose replica Jobs exist already. Jobs that ran on this
    machine serve a GPU flavor on the CPU, and their trainer Job refused that config (the rehearsal e2e, ffcaf72)."""
    on_cpu = [*BASE, "inference.device=cpu"]  # a GPU replica_flavor (the default)
    assert any("runs vLLM's GPU image" in p for p in hf_jobs_problems(compose_run_config(on_cpu)))
    in_the_job = [
        "role=trainer",
        "launcher.hf_jobs.namespace=me",
        "inference.use_proxy=true",
        "proxy.token_env=HF_TOKEN",
    ]
    assert hf_jobs_problems(compose_run_config([*on_cpu, *in_the_job])) == []
