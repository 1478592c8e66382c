"""A run on a shared fleet (agrpo/config/shared_fleet_checks.py): what it must be itself (the validation pass), and
what it must share with the fleet, checked against the fleet's real record (in a runtime dir of the test's own) before
any process starts: a run with another model exits 2 naming both, and nothing is started."""

from __future__ import annotations

import subprocess

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems
from agrpo.errors import ConfigError
from agrpo.fleet.registry import write_fleet
from agrpo.processes.private_dir import RUNTIME_ENV
from tests.fleet.test_registry import a_record
from tests.specs import spec_for


def problems(*overrides):
    return find_problems(compose_run_config(["+recipe=smoke", *overrides], output_dir="/runs/r"))


def test_a_run_on_a_shared_fleet_must_sync_in_the_background():
    found = problems("inference.shared_fleet=demo", "sync.mode=blocking")
    assert len(found) == 1 and found[0].startswith("inference.shared_fleet=demo needs sync.mode=background")
    assert "never paused by one run" in found[0]
    assert problems("sync.mode=blocking") == []  # alone, a run may block


def test_other_launchers_roles_and_no_proxy_are_refused_naming_the_key():
    found = " ".join(problems("inference.shared_fleet=demo", "launcher=accelerate", "inference.use_proxy=false"))
    assert "attaches runs with launcher=local so far (launcher=accelerate)" in found
    assert "a shared fleet is always behind its proxy; drop inference.use_proxy=false" in found


def test_the_shared_knobs_are_checked():
    found = problems("inference.shared.max_tenants=0", "inference.shared.lease_s=1")
    assert "inference.shared.max_tenants must be >= 1 (runs a fleet takes at once)" in found
    assert any(problem.startswith("inference.shared.lease_s=1.0 must be >= 2 seconds") for problem in found)


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """The record of a running fleet `demo` (this process stands for the fleet's) of smoke's model."""
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    model = str(spec_for("+recipe=smoke", output_dir="/runs/r").model.name_or_path)
    record = a_record("demo", model=model)
    write_fleet(record)
    return record


def test_a_run_with_another_model_exits_2_naming_both_before_any_process(fleet, monkeypatch, tmp_path):
    import agrpo.processes.managed as managed
    from agrpo.cli import run

    started = []
    monkeypatch.setattr(managed.ManagedProcess, "start", lambda self, *a, **k: started.append(self.name))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    other = tmp_path / "other-model"
    cfg = compose_run_config(
        ["+recipe=smoke", "inference.shared_fleet=demo", f"model.name_or_path={other}", "model.builder=null"],
        output_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ConfigError) as caught:
        run(cfg)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert f"the fleet demo serves the model {fleet.model}, and this run trains {other}" in message
    assert started == []  # no replica, proxy, trainer or any other process
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_max_model_len_rank_and_versions_against_the_fleet(fleet, tmp_path):
    from agrpo.config.shared_fleet_checks import attach_problems

    cfg = spec_for(
        "+recipe=smoke", "inference.max_model_len=512", "lora.r=16", "trainer.max_staleness=11", output_dir="/r"
    )
    found = attach_problems(cfg, fleet, fleet.model)
    assert len(found) == 3
    assert found[0].startswith("inference.max_model_len=512 exceeds the fleet demo's max_model_len=256")
    assert found[1].startswith("lora.r=16 exceeds the fleet demo's max_lora_rank=8")
    assert "or start the fleet with inference.max_lora_rank >= 16" in found[1]
    assert found[2].startswith("this run keeps up to 13 adapter versions loaded (trainer.max_staleness + 2), more than")
    assert attach_problems(spec_for("+recipe=smoke", "lora.r=4", output_dir="/r"), fleet, fleet.model) == []


def test_agrpo_help_lists_the_shared_fleet_keys(capsys):
    from agrpo.help import main_help
    from agrpo.paths import CONF_DIR

    assert main_help(CONF_DIR, ["--help", "inference"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "inference.shared_fleet" in text and "attaches to as a tenant" in text
    assert "inference.shared.max_tenants" in text and "inference.shared.lease_s" in text
