"""GPU indices are the run's own (0..N-1 as torch counts them); children are given the machine's ids."""

import pytest

from agrpo.errors import ConfigError
from agrpo.launchers.gpus import to_physical, visible_devices
from agrpo.launchers.local import build_local_plan
from tests.specs import spec_for


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("2,3", ["2", "3"]),
        (" 4 , 6", ["4", "6"]),
        ("1,-1,3", ["1"]),  # CUDA stops at the first invalid entry
        ("GPU-8f3c,GPU-aa01", ["GPU-8f3c", "GPU-aa01"]),
    ],
)
def test_visible_devices(value, expected):
    assert visible_devices(value) == expected


def test_to_physical_maps_through_the_parents_list():
    assert to_physical([0, 1], ["2", "3"]) == [2, 3]
    assert to_physical([1], ["5", "2"]) == [2]
    assert to_physical([0], ["GPU-8f3c"]) == ["GPU-8f3c"]
    assert to_physical([0, 1], None) == [0, 1]  # unset: indices are the machine's
    assert to_physical(None, ["2"]) is None
    with pytest.raises(ConfigError, match="trainer.gpus"):
        to_physical([2], ["2", "3"])


def plan_with(visible, *overrides, num_gpus=2):
    cfg = spec_for("+recipe=smoke", *overrides, output_dir="/runs/r1")
    return build_local_plan(cfg, "/runs/r1", "cuda", num_gpus, range(2), python="py", visible_gpus=visible)


def test_plan_under_cuda_visible_devices_2_3_uses_physical_2_and_3():
    plan = plan_with(["2", "3"])
    replica = plan.services[0]
    assert replica.gpus == [3] and replica.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert plan.trainer.gpus == [2] and plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "2"


def test_plan_without_cuda_visible_devices_is_unchanged():
    plan = plan_with(None)
    assert plan.services[0].env["CUDA_VISIBLE_DEVICES"] == "1" and plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_explicit_indices_count_the_visible_gpus():
    plan = plan_with(["4", "5", "6"], "trainer.gpus=[0,1]", "inference.gpus=[2]", "launcher=accelerate", num_gpus=3)
    assert plan.services[0].env["CUDA_VISIBLE_DEVICES"] == "6"
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_trainer_only_role_gets_the_visible_gpus_by_their_machine_ids():
    plan = plan_with(["2", "3"], "role=trainer", "inference.urls=[http://10.0.0.1:8000]", "launcher=accelerate")
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "2,3"
