"""The model card is a pure function of the run: its header, tables and snippets, and snippets that actually work
(the peft one is executed on the tiny model; the vLLM command is parsed by vLLM's own argument parser)."""

from __future__ import annotations

import re
import shlex
import shutil

import yaml

from agrpo.report.card import build_card, lora_module_name, redact
from agrpo.report.push import is_hub_id

CONFIG = {
    "run_name": "my_task",
    "model": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"},
    "lora": {"r": 12, "alpha": 24, "target_modules": ["q_proj", "v_proj"]},
    "data": {"loader": "agrpo.data.jsonl.load_jsonl", "path": "/data/my_task.jsonl", "name": None},
    "reward": {
        "funcs": [
            {"_target_": "agrpo.rewards.generic.exact_match", "column": "answer", "weight": 1.0},
            {"_target_": "agrpo.rewards.generic.length_within", "max_len": 64, "weight": 0.1},
        ]
    },
    "trainer": {
        "max_steps": 30,
        "learning_rate": 5e-4,
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 64,
        "max_staleness": 2,
    },
    "inference": {"replicas": 2},
    "proxy": {"token_env": "PROXY_TOKEN", "text_chars_per_token": 4},
    "launcher": {"hf_jobs": {"api_token": "hf_should_never_show"}},
}


def run_info(**changes):
    info = {
        "repo_id": "alice/my-task-lora",
        "base_model": "Qwen/Qwen2.5-0.5B-Instruct",
        "base_model_on_hub": True,
        "config": CONFIG,
        "metrics": {"global_step": 30, "reward_first": 0.25, "reward_last": 0.75, "step_s_mean": 2.5},
        "evals": [],
        "curves": None,
        "command": "python -m agrpo data=jsonl data.path=/data/my_task.jsonl",
    }
    return {**info, **changes}


def front_matter(card: str) -> dict:
    match = re.match(r"---\n(.*?)\n---\n", card, re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def test_header_names_the_base_model_only_when_it_is_a_hub_id():
    meta = front_matter(build_card(run_info()))
    assert meta == {
        "base_model": "Qwen/Qwen2.5-0.5B-Instruct",
        "library_name": "peft",
        "pipeline_tag": "text-generation",
        "tags": ["agrpo", "grpo", "lora", "trl", "base_model:adapter:Qwen/Qwen2.5-0.5B-Instruct"],
    }
    local = build_card(run_info(base_model="/models/tiny", base_model_on_hub=False))
    assert "base_model" not in front_matter(local)
    assert "The base model was a local folder (`/models/tiny`)" in local


def test_training_section_has_the_recipe_settings_and_the_resolved_config():
    card = build_card(run_info())
    assert "```bash\npython -m agrpo data=jsonl data.path=/data/my_task.jsonl\n```" in card
    for row in (
        "| recipe / run name | `my_task` |",
        "| data | `my_task.jsonl` (load_jsonl) |",
        "| reward terms | `agrpo.rewards.generic.exact_match` x 1.0, `agrpo.rewards.generic.length_within` x 0.1 |",
        "| LoRA | r=12, alpha=24, targets q_proj, v_proj |",
        "| steps | 30 |",
        "| samples per step x generations per prompt | 16 x 8 |",
        "| vLLM replicas | 2 |",
    ):
        assert row in card
    config_block = card.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    shown = yaml.safe_load(config_block)
    assert shown["reward"] == CONFIG["reward"] and shown["proxy"]["text_chars_per_token"] == 4
    assert shown["launcher"]["hf_jobs"]["api_token"] == "<redacted>" and "hf_should_never_show" not in card


def test_results_section_curves_metrics_and_eval_table():
    base = {
        "problems": 50,
        "k": 4,
        "mean_at_k": 0.1,
        "pass_at_1": 0.1,
        "pass_at_k": 0.3,
        "problems_solved": 15,
        "adapter": None,
        "temperature": 0.6,
        "max_tokens": 64,
    }
    tuned = {**base, "mean_at_k": 0.4, "pass_at_k": 0.6, "problems_solved": 30, "adapter": "/runs/x/final_adapter"}
    card = build_card(run_info(curves="training_curves.png", evals=[base, tuned]))
    assert "![Training curves](training_curves.png)" in card
    assert "| mean reward, first 5 steps | 0.2500 |" in card and "| optimizer steps | 30 |" in card
    assert "| model | problems | k | mean@k | pass@1 | pass@4 |" in card
    assert "| base model | 50 | 4 | 0.1000 | 0.1000 | 0.3000 | 15 |" in card
    assert "| this adapter | 50 | 4 | 0.4000 | 0.1000 | 0.6000 | 30 |" in card
    bare = build_card(run_info(metrics=None, command=None))
    assert "No metrics were recorded" in bare and "Evaluation" not in bare and "```bash\npython" not in bare


def test_usage_snippets_name_the_repo_the_adapter_and_a_rank_vllm_serves():
    card = build_card(run_info())
    assert (
        "vllm serve Qwen/Qwen2.5-0.5B-Instruct --enable-lora --max-lora-rank 16 "
        "--lora-modules my-task-lora=alice/my-task-lora"
    ) in card  # r=12 rounds up to vLLM's 16
    assert '"model": "my-task-lora"' in card and '"max_tokens": 64' in card and "max_new_tokens=64" in card
    assert "chat template" not in card.split("## Use it")[1].split("###")[0]
    config = {**CONFIG, "model": {**CONFIG["model"], "chat_template": "qwen2_5"}}
    assert "Trained with the `qwen2_5` chat template" in build_card(run_info(config=config))
    assert 'PeftModel.from_pretrained(base, "alice/my-task-lora")' in card
    assert lora_module_name("alice/x") == "x" and lora_module_name("x") == "x"


def test_helpers():
    assert redact({"a": {"hf_token": "hf_x", "token_env": "NAME", "n_token": 3}}) == {
        "a": {"hf_token": "<redacted>", "token_env": "NAME", "n_token": 3}
    }
    assert is_hub_id("Qwen/Qwen2.5-0.5B") and not is_hub_id("/models/tiny") and not is_hub_id("tiny")


def code_block(card: str, language: str) -> str:
    return card.split(f"```{language}\n", 1)[1].split("\n```", 1)[0]


def test_the_peft_snippet_runs(tiny_model_dir, random_adapter_dir, tmp_path):
    """The snippet as printed, with the base and the repo pointing at local folders (no download here)."""
    from transformers import AutoTokenizer

    adapter = tmp_path / "adapter"
    shutil.copytree(random_adapter_dir, adapter)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(adapter)  # as the trainer saves it
    card = build_card(run_info(repo_id=str(adapter), base_model=str(tiny_model_dir), base_model_on_hub=False))
    snippet = code_block(card, "python").replace("max_new_tokens=64", "max_new_tokens=4")
    assert "max_new_tokens=4)" in snippet
    namespace: dict = {}
    exec(compile(snippet, "card-snippet", "exec"), namespace)  # our own card's snippet
    assert type(namespace["model"]).__name__ == "PeftModelForCausalLM"
    assert namespace["output"].shape[1] > namespace["inputs"]["input_ids"].shape[1]


def test_the_vllm_command_parses_with_vllms_own_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    line = next(line for line in build_card(run_info()).splitlines() if line.startswith("vllm serve "))
    argv = shlex.split(line)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", argv[2], *argv[3:]])
    assert args.enable_lora and args.max_lora_rank == 16
    assert [(m.name, m.path) for m in args.lora_modules] == [("my-task-lora", "alice/my-task-lora")]
