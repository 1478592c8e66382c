"""A plan is data: it names the run's ports and secrets (placeholders), and building it reserves no port and makes
no secret. The executor makes them when it runs the plan and binds them in (`bind`, pure: tested here without
sockets); the last tests make them for real (`bound`), as two sweep points running at once do."""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import socket

import pytest
import yaml

import agrpo.processes.ports as ports
from agrpo.launchers.accelerate import ACCELERATE_CONFIG_FILE, AccelerateLauncher
from agrpo.launchers.binding import bound
from agrpo.launchers.local import LocalLauncher
from agrpo.launchers.plan import PLACEHOLDER, Placeholders, PortGroup, bind, shown_command
from tests.plans import example_values
from tests.specs import spec_for, with_values

AUTO = ("inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2")


@pytest.fixture()
def no_side_effects(monkeypatch):
    """Building a plan may open no socket, take no port lock and draw no secret."""

    def refused(*args, **kwargs):
        raise AssertionError("building a plan had a side effect")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(ports, "_lock_port", refused)
    monkeypatch.setattr(secrets, "token_urlsafe", refused)


def test_a_built_plan_names_its_ports_and_secrets_and_holds_none(no_side_effects, tmp_path):
    cfg = spec_for("+recipe=smoke", "inference.replicas=2", "inference.base_port=9300", output_dir=str(tmp_path))
    plan = LocalLauncher().build_plan(cfg)
    assert plan.placeholders == Placeholders(
        [PortGroup(["vllm-0", "vllm-1", "proxy"], 9300, "127.0.0.1")], ["proxy-admin-token", "replica-key"]
    )
    assert plan == LocalLauncher().build_plan(cfg)  # the same spec builds the same plan: nothing fresh in it
    proxy = plan.services[-1]
    assert proxy.port == "<port:proxy>" and plan.vllm_url == "http://127.0.0.1:<port:proxy>"
    assert "--upstream http://127.0.0.1:<port:vllm-1>" in shown_command(proxy.argv)
    assert proxy.env["AGRPO_REPLICA_API_KEY"] == plan.services[0].env["VLLM_API_KEY"] == "<secret:replica-key>"
    printed = plan.render()
    assert "[ports] vllm-0, vllm-1, proxy: the first 3 free at or above 9300 (inference.base_port)" in printed
    assert "[secrets] proxy-admin-token, replica-key: made fresh when the run starts" in printed
    assert "AGRPO_PROXY_ADMIN_TOKEN=<secret:proxy-admin-token>" in printed


def test_only_what_the_plan_uses_is_named(no_side_effects, tmp_path):
    """One replica without a proxy: its port and key; replicas elsewhere: the proxy's port and token only; a fleet
    that sizes itself: every slot's port, the spares' too."""
    one = LocalLauncher().build_plan(spec_for("+recipe=smoke", output_dir=str(tmp_path)))
    assert one.placeholders.names() == ["<port:vllm-0>", "<secret:replica-key>"]
    urls = "inference.urls=[http://10.0.0.1:8000,http://10.0.0.2:8000]"
    elsewhere = LocalLauncher().build_plan(spec_for("+recipe=smoke", "role=trainer", urls, output_dir=str(tmp_path)))
    assert elsewhere.placeholders.names() == ["<port:proxy>", "<secret:proxy-admin-token>"]
    auto = LocalLauncher().build_plan(spec_for("+recipe=smoke", *AUTO, output_dir=str(tmp_path)))
    assert auto.placeholders.ports[0].names == ["vllm-0", "vllm-1", "proxy"] and auto.fleet.spares[0].name == "vllm-1"


def test_bind_puts_each_value_wherever_its_placeholder_is(tmp_path):
    """Commands, env, URLs, ports, the spares of a fleet, the files written into the run dir and the notes."""
    cfg = spec_for("+recipe=smoke", "launcher=accelerate", *AUTO, output_dir=str(tmp_path))
    plan = AccelerateLauncher().build_plan(cfg)
    printed = plan.render()
    values = example_values(plan)
    ran = bind(plan, values)
    assert not PLACEHOLDER.search(json.dumps(dataclasses.asdict(ran))) and ran.placeholders == Placeholders()
    assert plan.render() == printed  # the plan as built is left as it was
    assert [spec.port for spec in [*ran.services, *ran.fleet.spares]] == [8100, 8102, 8101]  # numbers once bound
    assert ran.fleet.spares[0].health_url == "http://127.0.0.1:8101/health" and ran.vllm_url.endswith(":8102")
    assert ran.services[0].env["VLLM_API_KEY"] == ran.fleet.spares[0].env["VLLM_API_KEY"] == "replica-key-value"
    assert yaml.safe_load(ran.files[ACCELERATE_CONFIG_FILE])["main_process_port"] == 29500  # an int in the file
    argv = ran.trainer.argv
    assert argv[argv.index("--main_process_port") + 1] == "29500" and "main_process_port: 29500" in ran.render()
    assert bind(ran, {}) == ran  # a bound plan has nothing left to bind


def test_bind_refuses_a_placeholder_without_a_value_and_leaves_lookalikes_alone(tmp_path):
    plan = LocalLauncher().build_plan(spec_for("+recipe=smoke", output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"<secret:replica-key>"):
        bind(plan, {"<port:vllm-0>": "8100"})
    plan.notes.append("a user's text <port:not-ours> is not the plan's")
    assert bind(plan, example_values(plan)).notes[-1] == "a user's text <port:not-ours> is not the plan's"


def test_the_printed_command_is_quoted_as_the_bound_one_will_be():
    argv = ["py", "two words", "--port", "<port:p>", "--url", "http://h:<port:p>/a b", "--key", "<secret:s>"]
    shown = shown_command(argv)
    assert shown == "py 'two words' --port <port:p> --url 'http://h:<port:p>/a b' --key <secret:s>"
    values = {"<port:p>": "8123", "<secret:s>": "Ab-_9"}
    bound_argv = [PLACEHOLDER.sub(lambda m: values[m[0]], arg) for arg in argv]
    assert PLACEHOLDER.sub(lambda m: values[m[0]], shown) == shlex.join(bound_argv)


def test_each_run_reserves_its_own_ports_and_makes_its_own_secrets_when_it_runs(tmp_path, caplog):
    """Two runs of one config at once (a sweep's points) get their own ports, searched from inference.base_port,
    held while they run and released after; and their own secrets. Each says which ports it took (the printed plan
    has their names only)."""
    caplog.set_level("INFO", logger="agrpo.launchers.binding")
    base = ports.free_ports(1, 23700)[0]
    cfg = spec_for("+recipe=smoke", "inference.replicas=2", f"inference.base_port={base}", output_dir=str(tmp_path))
    plan = LocalLauncher().build_plan(cfg)
    with bound(plan) as first, bound(plan) as second:
        taken = [[spec.port for spec in run.services] for run in (first, second)]
        assert all(port >= base for port in taken[0] + taken[1]) and not set(taken[0]) & set(taken[1])
        assert all(ports.port_locked_by_another_run(port) for port in taken[0] + taken[1])
        assert first.trainer.env["AGRPO_PROXY_ADMIN_TOKEN"] != second.trainer.env["AGRPO_PROXY_ADMIN_TOKEN"]
        assert first.services[0].env["VLLM_API_KEY"] != second.services[0].env["VLLM_API_KEY"]
        vllm_0, vllm_1, proxy = taken[0]
        assert f"this run's ports: vllm-0={vllm_0}, vllm-1={vllm_1}, proxy={proxy}" in caplog.messages
    assert not any(ports.port_locked_by_another_run(port) for port in taken[0] + taken[1])


def test_no_free_port_releases_what_was_reserved(tmp_path):
    """The accelerate plan reserves two groups; when the second finds none, the first is released too."""
    base = ports.free_ports(1, 23800)[0]
    cfg = spec_for("+recipe=smoke", "launcher=accelerate", output_dir=str(tmp_path))
    cfg = with_values(cfg, {"inference.base_port": base, "launcher.accelerate.main_process_port": 65535})
    plan = AccelerateLauncher().build_plan(cfg)
    held = ports.reserve_ports(1, 65535, search=1) if ports.port_free(65535) else None
    try:
        with pytest.raises(Exception, match="free ports"), bound(plan):
            pass
        assert not ports.port_locked_by_another_run(base)
    finally:
        if held is not None:
            held.release()
