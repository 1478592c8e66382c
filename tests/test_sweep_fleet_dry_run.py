"""A dry-run sweep on a shared fleet that is not up plans every point and exits 0 (issue 43's leftovers, item 2):
the points plan against the fleet the sweep would start (agrpo/launchers/shared_fleet.py `planned_fleet`), through
the real CLI on hydra-joblib-launcher; a plain run's dry run still needs the fleet up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agrpo.errors import ConfigError
from agrpo.launchers import shared_fleet
from agrpo.launchers.shared_fleet import SWEEP_STARTS_FLEET_ENV, planned_fleet, sweep_would_start
from agrpo.processes.private_dir import RUNTIME_ENV
from tests.processes import agrpo


def spec(**inference):
    return SimpleNamespace(
        inference=SimpleNamespace(
            shared_fleet="sw", max_model_len=256, max_loras=3, shared=SimpleNamespace(max_tenants=4), **inference
        ),
        model=SimpleNamespace(name_or_path="some/hub-model"),
        lora=SimpleNamespace(r=8),
        launcher=SimpleNamespace(dry_run=True),
    )


def test_the_fleet_to_be_has_a_placeholder_url_and_the_runs_own_figures():
    fleet = planned_fleet(spec())
    assert fleet.name == "sw" and fleet.url == "<URL of fleet sw once the sweep started it>"
    assert (fleet.model, fleet.max_model_len, fleet.max_lora_rank, fleet.versions_per_tenant) == (
        "some/hub-model", 256, 8, 3
    )  # fmt: skip
    assert fleet.admin_token == ""  # nothing to register with: a dry run registers nothing


def test_only_a_sweep_that_would_start_that_fleet_lets_a_point_plan_without_its_record(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    monkeypatch.delenv(SWEEP_STARTS_FLEET_ENV, raising=False)
    assert not sweep_would_start("sw")  # a plain run's dry run: the record is needed
    monkeypatch.setenv(SWEEP_STARTS_FLEET_ENV, "other")
    assert not sweep_would_start("sw")
    monkeypatch.setenv(SWEEP_STARTS_FLEET_ENV, "sw")
    assert sweep_would_start("sw")
    monkeypatch.setattr(shared_fleet, "load_fleet", lambda name: object())  # a fleet of that name is up after all
    assert not sweep_would_start("sw")


def test_a_plain_dry_run_on_a_fleet_that_is_not_up_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    monkeypatch.delenv(SWEEP_STARTS_FLEET_ENV, raising=False)
    with pytest.raises(ConfigError, match="no fleet named 'sw' is running"):
        shared_fleet.attach(spec(), build=None)


def test_a_dry_run_sweep_on_a_fleet_that_is_not_up_plans_every_point_and_exits_0(tmp_path):
    result = agrpo(
        "-m", "+recipe=smoke", "launcher.dry_run=true", "lora.r=1,4", "inference.shared_fleet=not-up-dry",
        cwd=tmp_path, env={RUNTIME_ENV: str(tmp_path / "rt")}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "the sweep would start fleet not-up-dry with: agrpo fleet up not-up-dry +recipe=smoke lora.r=4" in out
    assert "Joblib.Parallel(n_jobs=2" in out + result.stderr  # the points at once, as a real sweep on a fleet
    for rank in (1, 4):  # every point planned: the trainer alone, on the fleet to be, at its own rank
        assert f"registers as a tenant (run smoke, 3 adapter versions, LoRA rank {rank}, lease 20 s)" in out
    assert out.count("note: fleet not-up-dry is not up: the sweep starts it before its points run") == 2
    assert "| 0 | lora.r=1 | no metrics |" in out and "| 1 | lora.r=4 | no metrics |" in out
    assert "vllm.entrypoints" not in out  # no replica of its own in a point's plan
    assert not (tmp_path / "rt" / "fleets" / "not-up-dry.json").exists()  # nothing was started
