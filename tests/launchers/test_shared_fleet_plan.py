"""A run on a shared fleet (agrpo/launchers/shared_fleet.py) and the fleet's own plan (agrpo/launchers/fleet_up.py).

The plans are pure. The registration is tested against a stand-in for the fleet's proxy (an HTTP server answering the
tenant API as docs/shared_fleet.md fixes it): what is asserted is what the launcher sends and when; the proxy's side
has its own tests, and tests/e2e/test_shared_fleet.py runs both for real."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agrpo.errors import LaunchError
from agrpo.fleet.registry import write_fleet
from agrpo.launchers.fleet_up import fleet_overrides, fleet_spec, render_plan, split_argv, without_trainer
from agrpo.launchers.local import build_local_plan
from agrpo.launchers.shared_fleet import LEASE_ENV, TENANT_ENV, AttachedPlan, attached_plan, attached_tenant
from agrpo.processes.private_dir import RUNTIME_ENV
from agrpo.proxy.settings import ADMIN_TOKEN_ENV
from tests.fleet.test_registry import a_record
from tests.plans import bound_example
from tests.specs import spec_for

ADMIN = "admin-token-of-the-fleet-" + "x" * 20
TENANT_TOKEN = "tenant-token-" + "y" * 30


def builder(cfg, run_dir):
    return build_local_plan(cfg, run_dir, "cpu", 0, range(2), python="py")


def attached(*overrides, url="http://127.0.0.1:8101"):
    cfg = spec_for("+recipe=smoke", "inference.shared_fleet=demo", *overrides, output_dir="/runs/r1")
    return cfg, attached_plan(cfg, a_record("demo", url=url, admin_token=ADMIN), builder)


def test_a_run_on_a_fleet_plans_its_trainer_only_against_the_fleets_proxy():
    cfg, plan = attached("inference.replicas=2")
    assert cfg.inference.use_proxy is True  # the trainer treats its URL as a proxy (prepare says so)
    assert plan.services == [] and plan.fleet is None and plan.placeholders.names() == []
    assert plan.vllm_url == "http://127.0.0.1:8101"
    assert plan.trainer.argv[-4:] == ["--vllm-url", "http://127.0.0.1:8101", "--num-replicas", "1"]
    env = plan.trainer.env
    assert {ADMIN_TOKEN_ENV, TENANT_ENV, LEASE_ENV} <= set(env) and env[LEASE_ENV] == "20"
    assert plan.tenant_request == {"run": "smoke", "lease_s": 20.0, "versions": 3, "lora_rank": 8}
    shown = plan.render()
    assert shown.splitlines()[2].startswith("[shared fleet] demo at http://127.0.0.1:8101: registers as a tenant")
    assert "[replica]" not in shown and "[proxy]" not in shown and "[ports]" not in shown
    assert "note: inference.replicas=2 is ignored: the fleet's replicas serve this run" in shown
    assert ADMIN not in shown and ADMIN not in json.dumps(plan.trainer.env)  # the fleet's token is never in a plan
    assert "AGRPO_PROXY_ADMIN_TOKEN=<secret:tenant-token> AGRPO_TENANT=<set>" in shown  # names, no values


def test_the_plans_binding_leaves_the_tenant_for_the_registration():
    _, plan = attached()
    bound = bound_example(plan)
    assert isinstance(bound, AttachedPlan) and bound.trainer.env[ADMIN_TOKEN_ENV] == "<secret:tenant-token>"


class FakeFleet:
    """A stand-in for the fleet's proxy: records each call (method, path, bearer token, body)."""

    def __init__(self, register_status=200):
        self.calls: list[tuple] = []
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_call(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                fleet.calls.append((self.command, self.path, token, body))
                if self.command == "POST" and self.path == "/fleet/tenants":
                    if register_status == 409:
                        return self.answer(409, {"message": "the fleet has room for 1 run: raise max_tenants"})
                    return self.answer(
                        200, {"tenant": "t1-smoke", "token": TENANT_TOKEN, "prefix": "t1-smoke/", "lease_s": 20.0}
                    )
                self.answer(200, {"unloaded": []} if self.command == "DELETE" else {"expires_in_s": 20.0})

            do_POST = do_DELETE = handle_call

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet_at(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    started = []

    def start(register_status=200):
        fake = FakeFleet(register_status)
        started.append(fake)
        write_fleet(a_record("demo", url=fake.url, admin_token=ADMIN))
        return fake

    yield start
    for fake in started:
        fake.close()


def test_the_run_registers_before_its_trainer_and_unregisters_whatever_the_outcome(fleet_at):
    fake = fleet_at()
    _, plan = attached("inference.shared.lease_s=2", url=fake.url)
    with pytest.raises(RuntimeError, match="the trainer failed"):
        with attached_tenant(plan) as running:
            assert fake.calls == [("POST", "/fleet/tenants", ADMIN, plan.tenant_request)]
            env = running.trainer.env
            assert (env[TENANT_ENV], env[ADMIN_TOKEN_ENV], env[LEASE_ENV]) == ("t1-smoke", TENANT_TOKEN, "2")
            threading.Event().wait(0.8)  # the launcher renews the lease every lease/4 s until the trainer does
            raise RuntimeError("the trainer failed")
    renewals = [call for call in fake.calls if call[1] == "/fleet/tenants/t1-smoke/lease"]
    assert len(renewals) >= 1 and all(call[2] == TENANT_TOKEN for call in renewals)
    assert fake.calls[-1] == ("DELETE", "/fleet/tenants/t1-smoke", TENANT_TOKEN, None)


def test_a_full_fleet_ends_the_run_with_its_reason(fleet_at):
    fake = fleet_at(register_status=409)
    _, plan = attached(url=fake.url)
    with pytest.raises(LaunchError) as caught:
        with attached_tenant(plan):
            pytest.fail("the trainer must not start")
    assert f"the fleet demo at {fake.url} has no room for this run: the fleet has room for 1 run" in str(caught.value)
    assert [call[0] for call in fake.calls] == ["POST"]  # nothing to unregister


def test_a_fleet_that_does_not_answer_is_one_paragraph(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    write_fleet(a_record("demo", url="http://127.0.0.1:9", admin_token=ADMIN))
    _, plan = attached(url="http://127.0.0.1:9")
    with pytest.raises(LaunchError, match=r"does not answer .*agrpo fleet status"):
        with attached_tenant(plan):
            pass


def test_other_plans_run_as_they_are():
    plan = bound_example(builder(spec_for("+recipe=smoke", output_dir="/runs/r1"), "/runs/r1"))
    with attached_tenant(plan) as running:
        assert running is plan


def test_the_fleets_plan_is_the_local_plan_less_its_trainer_sized_for_tenants():
    cfg = fleet_spec(spec_for("+recipe=smoke", "inference.shared.max_tenants=3", output_dir="/runs/f"))
    plan = without_trainer(builder(cfg, "/runs/f"))
    replica, proxy = bound_example(plan).services
    flag = {key: replica.argv[replica.argv.index(key) + 1] for key in ("--max-loras", "--max-cpu-loras")}
    assert flag == {"--max-loras": "9", "--max-cpu-loras": "18"}  # 3 tenants x (max_staleness 1 + 2), twice that
    assert "--tenancy" in proxy.argv and proxy.argv[proxy.argv.index("--max-loras") + 1] == "9"
    shown = render_plan(plan, "demo")
    assert shown.splitlines()[:2] == ["agrpo fleet demo, run dir /runs/f", "serves at http://127.0.0.1:<port:proxy>"]
    assert "[trainer]" not in shown and "agrpo.trainer" not in shown and "[proxy] proxy" in shown


def test_the_fleet_commands_words():
    assert split_argv(["sweep", "+recipe=smoke"]) == ("sweep", ["+recipe=smoke"])
    assert split_argv(["+recipe=smoke", "lora.r=4"]) == ("default", ["+recipe=smoke", "lora.r=4"])
    assert fleet_overrides(["+recipe=smoke", "inference.shared_fleet=sweep", "lora.r=16"]) == [
        "+recipe=smoke",
        "lora.r=16",
    ]
