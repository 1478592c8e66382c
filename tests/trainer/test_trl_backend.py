"""Mapping our config onto TRL's AsyncGRPOConfig and peft's LoraConfig (no server, no training)."""

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.errors import ConfigError
from agrpo.config.resolve import VLLM_LORA_RANKS
from agrpo.trainer.console.final_metrics import final_metrics
from agrpo.trainer.trl_backend import build_grpo_args, build_peft_config
from tests.specs import spec_for


def cfg_for(*overrides, tmp="/tmp/agrpo-args"):
    return spec_for("+recipe=smoke", *overrides, output_dir=tmp, cuda=False)


def test_grpo_args_carry_the_config_values(tmp_path):
    cfg = cfg_for(
        "trainer.learning_rate=0.25", "trainer.max_staleness=3", "trainer.weight_sync_steps=2", tmp=str(tmp_path)
    )
    args = build_grpo_args(cfg, "http://127.0.0.1:9999", num_replicas=1, use_gpu=False)
    assert args.output_dir == str(tmp_path)
    assert args.vllm_server_base_url == "http://127.0.0.1:9999"
    assert (args.learning_rate, args.max_staleness, args.weight_sync_steps) == (0.25, 3, 2)
    assert (args.num_generations, args.max_completion_length, args.max_steps) == (8, 16, 60)
    assert args.bf16 is False and args.use_cpu is True
    assert args.gradient_checkpointing is False
    assert args.report_to == ["tensorboard"]
    assert args.save_strategy == "steps" and args.save_steps == 20


def test_auto_inflight_gives_trl_the_controllers_ceiling_as_slots_and_queue(tmp_path):
    """With auto, TRL's slots and queue are only ceilings: the paced loop admits what the controller allows. The
    ceiling is the staleness bound, samples per step x weight_sync_steps x max_staleness, whatever the
    number of replicas."""
    cfg = cfg_for("trainer.max_staleness=3", "trainer.weight_sync_steps=2", tmp=str(tmp_path))
    one = build_grpo_args(cfg, "http://x", num_replicas=1, use_gpu=False)
    three = build_grpo_args(cfg, "http://x", num_replicas=3, use_gpu=False)
    assert one.max_inflight_tasks == three.max_inflight_tasks == 16 * 2 * 3
    assert one.queue_maxsize == one.max_inflight_tasks


def test_a_fixed_inflight_is_kept_with_twice_the_queue(tmp_path):
    args = build_grpo_args(cfg_for("trainer.max_inflight_tasks=7", tmp=str(tmp_path)), "http://x", 4, False)
    assert (args.max_inflight_tasks, args.queue_maxsize) == (7, 14)


def test_extra_passes_through_and_unknown_extra_fails(tmp_path):
    cfg = cfg_for("+trainer.extra.top_k=5", tmp=str(tmp_path))
    assert build_grpo_args(cfg, "http://x", 1, False).top_k == 5
    bad = compose_run_config(["+recipe=smoke", "+trainer.extra.not_a_trl_field=1"], output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="not_a_trl_field"):
        prepare(bad)  # the validation pass reads TRL's dataclass: no trainer is built from it


def test_bf16_is_the_specs(tmp_path):
    """trainer.bf16 as prepare resolved it (bf16 on a GPU that computes in it: agrpo/config/gpu_precision.py)."""
    assert build_grpo_args(cfg_for(tmp=str(tmp_path)), "http://x", 1, use_gpu=False).bf16 is False
    on_gpu = spec_for("+recipe=smoke", output_dir=str(tmp_path), cuda=True)
    assert on_gpu.trainer.bf16 is True and build_grpo_args(on_gpu, "http://x", 1, use_gpu=False).bf16 is True


def test_peft_config_from_lora_group():
    cfg = cfg_for("lora.r=1", "lora.alpha=2")
    peft = build_peft_config(cfg.lora)
    assert (peft.r, peft.lora_alpha, peft.use_dora, peft.bias) == (1, 2, False, "none")
    assert set(peft.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_our_lora_ranks_match_trls():
    from trl.experimental.async_grpo.async_grpo_trainer import VLLM_LORA_RANKS as TRL_RANKS

    assert tuple(TRL_RANKS) == VLLM_LORA_RANKS


def test_final_metrics_windows():
    history = [{"reward": r, "loss": 0.0} for r in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]] + [{"train_runtime": 12.5}]
    summary = final_metrics(history, window=2)
    assert summary["reward_first"] == pytest.approx(0.15)
    assert summary["reward_last"] == pytest.approx(0.65)
    assert summary["train_runtime_s"] == 12.5 and summary["steps_logged"] == 7


def test_final_metrics_with_steps_no_reward_scored():
    """TRL logs `reward` as None for a step in which every reward returned None: the summary must not crash (it
    did, with a TypeError, at the end of such a run) and says how many steps and completions went unscored."""
    history = [{"reward": None}, {"reward": 0.5, "rollout/unscored_total": 3.0}, {"reward": float("nan")}]
    history += [{"reward": 1.0, "rollout/unscored_total": 1.0}]
    summary = final_metrics(history, window=5)
    assert summary["rewards"] == [0.5, 1.0] and summary["reward_first"] == pytest.approx(0.75)
    assert summary["steps_logged"] == 4 and summary["steps_unscored"] == 2 and summary["unscored_completions"] == 4
    assert "reward_first" not in final_metrics([{"reward": None}])


def test_chat_template_by_trl_name_or_file(tmp_path, tiny_model_dir):
    from agrpo.models.chat_template import resolve_chat_template
    from agrpo.trainer.trl_backend import load_tokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    assert resolve_chat_template("qwen2_5") == qwen2_5_chat_template
    mine = tmp_path / "mine.jinja"
    mine.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert resolve_chat_template(str(mine)) == mine.read_text()
    with pytest.raises(ConfigError, match="model.chat_template='nope'"):
        resolve_chat_template("nope")
    cfg = cfg_for(f"model.name_or_path={tiny_model_dir}", "model.builder=null", f"model.chat_template={mine}")
    tokenizer = load_tokenizer(cfg.model)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    assert load_tokenizer(cfg_for().model) is None  # no override: TRL loads the model's own tokenizer
