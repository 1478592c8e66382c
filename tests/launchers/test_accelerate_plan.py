"""launcher=accelerate (pure parts): the FSDP2 config file and the plan (local plan, trainer under accelerate)."""

import subprocess
import sys

import pytest

from agrpo.errors import ConfigError
from agrpo.launchers.accelerate import build_accelerate_plan
from agrpo.launchers.fsdp import build_fsdp_config, layer_cls_from_model_config
from agrpo.launchers.local import build_local_plan
from tests.plans import bound_example
from tests.specs import spec_for


def plans_for(*overrides, num_gpus=4, device="cuda", cpu_count=2, layer_cls="Qwen2DecoderLayer"):
    cfg = spec_for("+recipe=smoke", "launcher=accelerate", *overrides, output_dir="/runs/r1", cuda=device == "cuda")
    local = build_local_plan(cfg, "/runs/r1", device, num_gpus, range(cpu_count), python="py")
    plan, accelerate_config = build_accelerate_plan(cfg, local, layer_cls, python="py")
    return bound_example(local), bound_example(plan), accelerate_config


def test_fsdp2_config_from_our_config():
    cfg = spec_for(
        "+recipe=smoke",
        "launcher=accelerate",
        "launcher.accelerate.reshard_after_forward=false",
        "launcher.accelerate.activation_checkpointing=true",
        output_dir="/x",
    )
    config = build_fsdp_config(cfg.launcher.accelerate, 3, 29501, "Qwen2DecoderLayer", on_cpu=False)
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 3
    assert config["main_process_port"] == 29501 and config["mixed_precision"] == "bf16"
    fsdp = config["fsdp_config"]
    assert fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
    assert fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"  # FULL loses non-zero ranks' adapter shards
    assert fsdp["fsdp_reshard_after_forward"] is False and fsdp["fsdp_activation_checkpointing"] is True
    assert config["use_cpu"] is False


def test_explicit_layer_class_wins_and_none_leaves_it_to_accelerate():
    cfg = spec_for("+recipe=smoke", "launcher.accelerate.transformer_layer_cls=MyLayer", output_dir="/x")
    assert (
        build_fsdp_config(cfg.launcher.accelerate, 2, 1, "Qwen2DecoderLayer", False)["fsdp_config"][
            "fsdp_transformer_layer_cls_to_wrap"
        ]
        == "MyLayer"
    )
    cfg = spec_for("+recipe=smoke", output_dir="/x")
    assert (
        "fsdp_transformer_layer_cls_to_wrap"
        not in build_fsdp_config(cfg.launcher.accelerate, 2, 1, None, False)["fsdp_config"]
    )


def test_layer_class_comes_from_the_model_architecture():
    assert layer_cls_from_model_config({"architectures": ["Qwen2ForCausalLM"]}) == "Qwen2DecoderLayer"
    assert layer_cls_from_model_config({"architectures": ["LlamaForCausalLM"]}) == "LlamaDecoderLayer"
    assert layer_cls_from_model_config({"architectures": ["NoSuchModel"]}) is None
    assert layer_cls_from_model_config({}) is None


def test_gpu_plan_keeps_replicas_and_runs_one_rank_per_trainer_gpu():
    local, plan, config = plans_for("inference.replicas=1")
    assert plan.services == local.services  # replicas planned exactly as launcher=local
    assert plan.services[0].gpus == [3]
    assert plan.trainer.gpus == [0, 1, 2] and plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert plan.trainer.argv == [
        "py",
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "/runs/r1/accelerate_fsdp.yaml",
        "--num_processes",
        "3",
        "--main_process_port",
        "29500",  # the first port from launcher.accelerate.main_process_port, as bound here
        "-m",
        "agrpo.trainer",
        "/runs/r1/config.yaml",
        "--vllm-url",
        "http://127.0.0.1:8100",
        "--num-replicas",
        "1",
    ]
    assert config["num_processes"] == 3
    assert "ACCELERATE_USE_CPU" not in plan.trainer.env
    rendered = plan.render()
    assert "GPU assignment: trainer ranks 0..2 -> GPUs [0, 1, 2]; vllm-0 -> [3]" in rendered
    assert "fsdp_version: 2" in rendered and "accelerate.commands.launch" in rendered


def test_two_replicas_behind_the_proxy_and_the_trainer_talks_to_it():
    _, plan, config = plans_for("inference.replicas=2")
    assert [s.role for s in plan.services] == ["replica", "replica", "proxy"]
    assert [s.gpus for s in plan.services[:2]] == [[2], [3]]
    assert plan.trainer.argv[-4:] == ["--vllm-url", "http://127.0.0.1:8102", "--num-replicas", "2"]
    assert config["num_processes"] == 2


def test_num_processes_knob_and_its_limit():
    _, plan, _ = plans_for("launcher.accelerate.num_processes=2")
    assert plan.trainer.argv[plan.trainer.argv.index("--num_processes") + 1] == "2"
    with pytest.raises(ConfigError, match="launcher.accelerate.num_processes"):
        plans_for("launcher.accelerate.num_processes=4")


def test_activation_checkpointing_twice_is_refused():
    with pytest.raises(ConfigError, match="trainer.gradient_checkpointing"):
        plans_for("launcher.accelerate.activation_checkpointing=true", "trainer.gradient_checkpointing=true")


def test_cpu_plan_runs_gloo_ranks_sharing_the_free_cores():
    _, plan, config = plans_for("launcher.accelerate.num_processes=2", num_gpus=0, device="cpu", cpu_count=5)
    assert plan.trainer.env["ACCELERATE_USE_CPU"] == "true"
    assert plan.trainer.env["OMP_NUM_THREADS"] == "2"  # (5 cores - 1 replica) / 2 ranks
    assert config["mixed_precision"] == "no" and config["use_cpu"] is False
    assert any("without FSDP sharding" in note for note in plan.notes)


def test_extra_args_go_to_accelerate_not_the_trainer():
    _, plan, _ = plans_for('launcher.accelerate.extra_args=["--dynamo_backend","no"]')
    argv = plan.trainer.argv
    assert argv.index("--dynamo_backend") < argv.index("agrpo.trainer")


def test_dry_run_prints_accelerate_and_vllm_commands_and_gpu_assignment(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agrpo",
            "+recipe=smoke",
            "launcher=accelerate",
            "launcher.dry_run=true",
            "launcher.accelerate.num_processes=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "agrpo plan (accelerate)" in out and "GPU assignment:" in out
    assert "accelerate.commands.launch --config_file" in out and "-m agrpo.trainer" in out
    assert "vllm.entrypoints.openai.api_server" in out
    assert not list(tmp_path.rglob("accelerate_fsdp.yaml"))  # a dry run writes nothing


def test_the_plan_carries_every_file_the_executor_writes(tmp_path):
    """The dry run lists the accelerate config and the resolved run config; the executor writes exactly those."""
    from agrpo.launchers.accelerate import ACCELERATE_CONFIG_FILE, AccelerateLauncher

    cfg = spec_for("+recipe=smoke", "launcher=accelerate", output_dir=str(tmp_path))
    plan = AccelerateLauncher().build_plan(cfg)
    assert set(plan.files) == {"config.yaml", ACCELERATE_CONFIG_FILE}
    assert "distributed_type" in plan.files[ACCELERATE_CONFIG_FILE]
    rendered = plan.render()
    assert f"[file] {tmp_path}/{ACCELERATE_CONFIG_FILE}" in rendered and f"[file] {tmp_path}/config.yaml" in rendered


def test_a_fleet_that_sizes_itself_keeps_its_spares_under_accelerate():
    """inference.replicas=auto with launcher=accelerate: the local plan's fleet (one replica started, the spare on its
    own GPU on demand) travels into the accelerate plan, whose executor is local's, fleet controller included."""
    cfg = spec_for(
        "+recipe=smoke",
        "launcher=accelerate",
        "inference.replicas=auto",
        "inference.max_replicas=2",
        output_dir="/runs/r1",
        cuda=True,
    )
    local = build_local_plan(cfg, "/runs/r1", "cuda", 4, range(2), python="py")
    plan, _ = build_accelerate_plan(cfg, local, "Qwen2DecoderLayer", python="py")
    assert plan.fleet is local.fleet and plan.placeholders.ports[0] == local.placeholders.ports[0]
    assert [spec.name for spec in plan.fleet.spares] == ["vllm-1"]
    assert [spec.name for spec in plan.services] == ["vllm-0", "proxy"]
    assert plan.trainer.argv[1:3] == ["-m", "accelerate.commands.launch"]
    spare_gpus = plan.fleet.spares[0].gpus
    assert (
        spare_gpus
        and not set(spare_gpus) & set(plan.trainer.gpus)
        and not set(spare_gpus) & set(local.services[0].gpus)
    )
    rendered = plan.render()
    assert "[fleet] auto: 1..2 replicas; starts 1" in rendered and "vllm-1 (on demand)" in rendered
    assert f"vllm-1 (on demand) -> {spare_gpus}" in rendered  # the GPU assignment note
