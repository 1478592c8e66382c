"""One render for a run's conversations (agrpo/models/chat_template.py `TurnRenderer`): training's rollout loop, the
agent data check and `agrpo eval` render with it, so the run's `trainer.extra.chat_template_kwargs` reach all three.
Before, eval rendered its prompts without them: a run trained with `{enable_thinking: false}` was evaluated on
prompts it never saw. The tokenizer is the tiny model's, with a Qwen3-style `enable_thinking` switch added."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from agrpo.agents.build import Agent
from agrpo.agents.prompt_budget import TrainingRenderer
from agrpo.agents.secret_word import load_secret_word_dataset
from agrpo.config.compose import compose_run_config
from agrpo.eval.episodes import AgentEpisodes
from agrpo.eval.runner import eval_prompts
from agrpo.models.chat_template import TurnRenderer, run_template_kwargs
from agrpo.models.tiny import build_tokenizer

NO_THINK = "<think>\n\n</think>\n\n"
SWITCH = "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
SWITCH += "{{- '" + NO_THINK.replace("\n", "\\n") + "' }}{%- endif %}"
KWARGS = ["+trainer.extra.chat_template_kwargs={enable_thinking: false}"]


@pytest.fixture(scope="module")
def tokenizer():
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(build_tokenizer())  # TRL knows the template before the switch is added
    tokenizer.chat_template += SWITCH
    return tokenizer


def test_the_run_kwargs_are_read_from_trainer_extra():
    assert run_template_kwargs(compose_run_config(["+recipe=smoke", *KWARGS])) == {"enable_thinking": False}
    assert run_template_kwargs(compose_run_config(["+recipe=smoke"])) == {}


def test_eval_prompts_are_rendered_with_the_runs_kwargs(tokenizer, tmp_path):
    model = tmp_path / "model"
    tokenizer.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    problems = {"prompt": [[{"role": "user", "content": "What is 2 + 3?"}]]}
    plain = ["+recipe=smoke", f"model.name_or_path={model}", "model.builder=null"]
    _, [before] = eval_prompts(compose_run_config(plain), problems)
    _, [after] = eval_prompts(compose_run_config([*plain, *KWARGS]), problems)
    assert tokenizer.decode(after) == tokenizer.decode(before) + NO_THINK  # what training renders, kwargs and all
    training = TurnRenderer(tokenizer, {"enable_thinking": False}, keep_prefix=False)
    assert after == training(problems["prompt"][0])


def test_agent_eval_and_the_data_check_render_each_turn_as_training_does(tokenizer):
    from agrpo.agents.environments import guarded_class
    from agrpo.agents.secret_word import SecretWordEnv

    cfg = compose_run_config(["+recipe=agent_smoke", *KWARGS], output_dir="/tmp/agrpo-render")
    agent = Agent.from_config(cfg.agent)
    row = load_secret_word_dataset(OmegaConf.create({"max_prompts": 1, "split": "test"}), seed=0)[0]
    seen = []

    def model(prompt_ids, seed):
        seen.append(prompt_ids)
        return {"token_ids": tokenizer.encode("done<|im_end|>", add_special_tokens=False), "finish_reason": "stop"}

    AgentEpisodes(agent, tokenizer, {}, run_template_kwargs(cfg)).play(model, row, seed=0)
    tool = guarded_class(SecretWordEnv, None)().get_secret  # the tool as the rollout loop offers it
    expected = tokenizer.apply_chat_template(
        row["prompt"], tools=[tool], add_generation_prompt=True, return_dict=False, enable_thinking=False
    )
    assert seen == [expected] and tokenizer.decode(expected).endswith(NO_THINK)
    prompt = row["prompt"]
    counted = TrainingRenderer(tokenizer, run_template_kwargs(cfg)).length(prompt, [])
    plain = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False)
    assert counted == len(plain) + len(tokenizer.encode(NO_THINK, add_special_tokens=False))
