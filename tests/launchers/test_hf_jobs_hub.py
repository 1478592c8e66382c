"""The Jobs launcher runs its plan on the Hub backend it was handed (agrpo/launchers/hf_jobs/hub.py): the plan asks the
backend's capabilities (where the Jobs run, the exposed-port URL form, its own plan lines), and the executor gets what
the backend's `connect` yields (API, token, reach, replay) with the placeholders only the running backend knows bound
into the plan. Pure apart from the plan's local inputs: no Hub, no stand-in started."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from agrpo.launchers import get_launcher
from agrpo.launchers.hf_jobs import executor
from agrpo.launchers.hf_jobs.hub import HubConnection, RealHub, backend_from_argv
from agrpo.launchers.hf_jobs.launcher import HFJobsLauncher
from agrpo.launchers.hf_jobs.plan import NAMESPACE_PLACEHOLDER
from tests.specs import spec_for

JOBS = ["+recipe=smoke", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=r1"]
PORT_PLACEHOLDER = "<test-gateway-port>"


@dataclass
class HereHub:
    """A backend whose Jobs would run on this machine, reached on a port known only once it runs."""

    jobs_on_this_machine: bool = True
    asked_by: str = "--here"
    detail_loggers: tuple[str, ...] = ("tests.here",)
    connected: list[str | None] = field(default_factory=list)

    def replica_url(self, configured: str) -> str:
        return "http://{job_id}--{port}.local:" + PORT_PLACEHOLDER

    def plan_lines(self) -> list[str]:
        return ["here: every Job on this machine"]

    @contextlib.contextmanager
    def connect(self, namespace: str | None, prices: dict[str, float]):
        self.connected.append(namespace)
        yield HubConnection(
            api="the api",
            namespace=namespace or "here-ns",
            token="here-token",
            replay=["--from", "here"],
            placeholders={PORT_PLACEHOLDER: "4242"},
            outcome={"where": "here"},
        )


def test_the_plan_takes_the_backends_capabilities():
    cfg = spec_for(*JOBS, "inference.device=cpu", jobs_on_this_machine=True)
    plan = HFJobsLauncher(HereHub()).build_plan(cfg)
    assert plan.jobs_on_this_machine and plan.hub_lines == ["here: every Job on this machine"]
    assert plan.replicas[0].url == f"http://<vllm-0-job-id>--8000.local:{PORT_PLACEHOLDER}"
    assert "here: every Job on this machine" in plan.render()
    real = HFJobsLauncher().build_plan(spec_for(*JOBS))
    assert not real.jobs_on_this_machine and real.hub_lines == []
    assert real.replicas[0].url == "https://<vllm-0-job-id>--8000.hf.jobs"


def test_execute_hands_the_executor_what_the_backend_yields_with_its_placeholders_bound(monkeypatch):
    seen: dict[str, Any] = {}

    class RecordingRun:
        def __init__(self, plan, api, reach, token, replay):
            seen.update(plan=plan, api=api, token=token, replay=replay, reach=reach)

        def execute(self):
            return {"reward_last": 1.0}

    monkeypatch.setattr(executor, "JobsRun", RecordingRun)
    hub = HereHub()
    launcher = HFJobsLauncher(hub)
    plan = launcher.build_plan(spec_for(*JOBS, "inference.device=cpu", jobs_on_this_machine=True))
    assert plan.namespace == NAMESPACE_PLACEHOLDER
    assert launcher.execute(plan) == {"reward_last": 1.0, "where": "here"}
    assert hub.connected == [None]  # no namespace in the config: the backend's own
    text = json.dumps(asdict(seen["plan"]))
    assert PORT_PLACEHOLDER not in text and NAMESPACE_PLACEHOLDER not in text
    assert seen["plan"].replica_url("abc") == "http://abc--8000.local:4242" and seen["plan"].namespace == "here-ns"
    assert (seen["api"], seen["token"], seen["replay"]) == ("the api", "here-token", ["--from", "here"])


def test_the_command_line_picks_the_backend_and_only_for_launcher_hf_jobs():
    hub, rest, notes = backend_from_argv(["+recipe=smoke", "--rehearse", "launcher=hf_jobs"])
    assert hub is not None and hub.jobs_on_this_machine and rest == ["+recipe=smoke", "launcher=hf_jobs"]
    assert backend_from_argv(["+recipe=smoke"]) == (None, ["+recipe=smoke"], [])
    assert isinstance(get_launcher("hf_jobs").hub, RealHub)
    assert get_launcher("hf_jobs", hub=hub).hub is hub
