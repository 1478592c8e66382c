"""The typed run spec (agrpo/config/spec.py): what `prepare` returns is frozen, holds Enum members in its choice fields
and every value resolve derives, and reads back from the config.yaml a run writes."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.config.resolve import derived_values
from agrpo.config.schema import RunConfig, choice_fields
from agrpo.config.schema.knobs import groups
from agrpo.config.spec import load_spec, select, spec_yaml, with_values

CASES = [
    ["+recipe=smoke"],
    ["+recipe=smoke", "inference.replicas=3", "lora.r=12", "trainer.max_staleness=2", "trainer.max_inflight_tasks=7"],
    ["+recipe=gsm8k", "inference.replicas=auto", "launcher=accelerate"],
    ["+recipe=agent_smoke", "logger.level=debug"],
]
# Each key resolve derives, and the value that asks for it (the schema's default): none may be left in a spec.
DERIVE_ME = {
    "inference.device": "auto",
    "inference.dtype": "auto",
    "inference.max_lora_rank": None,
    "inference.max_loras": None,
    "inference.use_proxy": None,
    "trainer.bf16": None,
    "trainer.queue_maxsize": -1,
    "trainer.token_budget": None,
    "eval.max_tokens": None,
}


def spec(overrides: list[str], cuda: bool = False) -> RunConfig:
    composed = compose_run_config(overrides, output_dir="/tmp/agrpo-spec")
    return prepare(composed, check_environment=False, cuda_available=cuda)


@pytest.fixture(scope="module")
def specs() -> dict[tuple[int, bool], RunConfig]:
    return {(index, cuda): spec(case, cuda) for index, case in enumerate(CASES) for cuda in (False, True)}


def test_the_spec_is_frozen_at_every_level(specs):
    prepared = specs[0, False]
    for prefix, schema in groups(RunConfig):
        node = select(prepared, prefix.rstrip(".")) if prefix else prepared
        assert type(node) is schema and dataclasses.is_dataclass(node)
        name = dataclasses.fields(schema)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(node, name, getattr(node, name))


def test_choice_fields_hold_members(specs):
    for prepared in specs.values():
        for key, enum in choice_fields(RunConfig).items():
            value = select(prepared, key)
            assert value is None or (isinstance(value, Enum) and type(value) is enum), (key, value)


def test_every_derived_value_is_filled(specs):
    for (index, cuda), prepared in specs.items():
        left = {key: select(prepared, key) for key, asks in DERIVE_ME.items() if select(prepared, key) == asks}
        assert left == {}, (CASES[index], cuda)
        assert derived_values(prepared, cuda_available=cuda) == {}, (CASES[index], cuda)  # nothing left to derive
        assert prepared.trainer.attention != "auto" or cuda  # on a CUDA machine the trainer decides (seam/attention.py)


def test_a_run_dirs_config_yaml_reads_back_as_the_same_spec(specs, tmp_path):
    for prepared in specs.values():
        (tmp_path / "config.yaml").write_text(spec_yaml(prepared))
        assert load_spec(tmp_path / "config.yaml") == prepared


def test_a_value_changes_by_a_typed_copy(specs):
    prepared = specs[0, False]
    changed = with_values(prepared, {"inference.device": "cuda", "reward.funcs.0.weight": 2.0, "role": "trainer"})
    assert changed.inference.device == "cuda" and changed.reward.funcs[0]["weight"] == 2.0 and changed.role == "trainer"
    assert type(changed.role).__name__ == "Role"
    assert prepared.inference.device == "cpu" and prepared.role == "all"  # the original is untouched
    assert prepared.reward.funcs[0].get("weight", 1.0) != 2.0
    assert changed.model is prepared.model  # groups that did not change are shared, not copied
