"""agent.warmstart (agrpo/agents/warmstart.py, warmstart_examples.py): the examples built from a run's own tool and
rows, and the warm-started folder planned, built and reused by content. No vLLM: the tiny model trains for a few
steps on the CPU; whether a warm start learns is measured by benchmarks/own_tool_task/run.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agrpo.agents import warmstart_examples as ex
from agrpo.errors import ConfigError

UNITS_PY = '''
FACTORS = {"florp": 7, "quib": 13}


def convert(amount: int, unit: str, exact: bool = True) -> str:
    """Convert an amount of a unit into zorbs.

    Args:
        amount: How many of the unit.
        unit: The unit to convert from.
        exact: Whether to round.
    """
    return str(int(amount) * FACTORS[unit])
'''

RECIPE = """
defaults:
  - override /model: tiny
  - override /data: jsonl
run_name: own_tool
model:
  chat_template: qwen2_5
data:
  path: train.jsonl
  shuffle: false
agent:
  tools: [units.py:convert]
  max_tool_calling_iterations: 2
  max_tool_output_chars: 64
  warmstart:
    enabled: true
    arguments: {amount: qty}
    rows: 6
    steps: 2
    batch_size: 4
reward:
  funcs:
    - {_target_: agrpo.rewards.generic.numeric_match, column: answer}
trainer:
  max_completion_length: 48
inference:
  max_model_len: 384
"""


@pytest.fixture()
def task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "units.py").write_text(UNITS_PY)
    rows = [
        {"prompt": f"How many zorbs is {q} {u}?", "qty": q, "unit": u, "answer": q * (7 if u == "florp" else 13)}
        for q, u in [(2, "florp"), (3, "quib"), (4, "florp"), (5, "quib"), (6, "florp"), (7, "quib"), (8, "florp")]
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "own_tool.yaml").write_text(RECIPE)
    return tmp_path


def planned(task, tiny_model_dir, *overrides: str):
    from agrpo.agents.warmstart import plan_warmstart
    from agrpo.cli import expand_recipe_paths
    from agrpo.config.compose import compose_run_config

    argv = ["+recipe=own_tool.yaml", f"model.name_or_path={tiny_model_dir}", f"cache_dir={task / 'cache'}"]
    cfg = compose_run_config(expand_recipe_paths([*argv, *overrides]), output_dir=str(task / "run"))
    return plan_warmstart(cfg)


# ---- the examples (pure) ----------------------------------------------------------------------------------------


def test_call_arguments_come_from_the_row():
    row = {"qty": 3, "unit": "quib", "prompt": "-"}
    params, required = ["amount", "unit", "exact"], ["amount", "unit"]
    assert ex.call_arguments(params, required, row, {"amount": "qty"}) == {"amount": 3, "unit": "quib"}
    with pytest.raises(ValueError, match=r"argument 'amount' of the tool reads column 'amount', which the rows do"):
        ex.call_arguments(params, required, row, {})
    with pytest.raises(ValueError, match=r"names \['amout'\], which the tool does not take"):
        ex.call_arguments(params, required, row, {"amout": "qty"})
    with pytest.raises(ValueError, match=r"set agent.warmstart.arguments.exact to a column"):
        ex.call_arguments(params, required, {**row, "amount": 1}, {"exact": "rounding"})


def test_every_row_makes_a_calling_and_a_guessing_episode():
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(200)]
    calls = [{"name": "convert", "arguments": {"amount": i}} for i in range(200)]
    answers = [str(i * 7) for i in range(200)]
    made = ex.episodes(prompts, calls, answers, answers, call_share=0.2, seed=0)
    assert len(made) == 400 and [e.call is not None for e in made[:4]] == [True, False, True, False]
    assert all(e.answer == str(e.call["arguments"]["amount"] * 7) for e in made[::2])  # answered from the reply
    assert all(g.answer != c.answer for c, g in zip(made[::2], made[1::2]))  # a guess is another row's answer
    trained = sum(e.train_call for e in made[::2])  # 0.25 of the calling episodes: 0.2 of the trained decisions
    assert 0.15 < trained / (trained + 200) < 0.25 and ex.answer_fields("{output} zorbs of {unit}") == [
        "output",
        "unit",
    ]


def test_an_episode_trains_the_call_and_the_answer_not_the_prompt_or_the_reply(tiny_model_dir):
    from transformers import AutoTokenizer

    from agrpo.models.chat_template import resolve_chat_template

    from agrpo.agents.warmstart import TOOL_TAGS

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = resolve_chat_template("qwen2_5")
    tokenizer.add_tokens(list(TOOL_TAGS))  # as the warm start gives the toy tokenizer: the call opens with one token
    schema = {"type": "function", "function": {"name": "convert", "parameters": {"type": "object", "properties": {}}}}

    def render(messages, generation):
        return tokenizer.apply_chat_template(
            messages, tools=[schema], add_generation_prompt=generation, return_dict=False
        )

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    eos = tokenizer.eos_token_id
    prompt = [{"role": "user", "content": "How many zorbs is 3 quib?"}]
    call = {"name": "convert", "arguments": {"amount": 3, "unit": "quib"}}
    ids, labels, tool_start = ex.tokens(render, encode, eos, ex.Episode(prompt, "39", call, "39", train_call=False))
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != ex.IGNORE])
    assert (
        trained
        == '\n{"name": "convert", "arguments": {"amount": 3, "unit": "quib"}}\n</tool_call><|im_end|>39<|im_end|>'
    )
    assert "<tool_response>\n39\n</tool_response>" in tokenizer.decode(ids[tool_start:])  # the reply: context only
    ids, labels, _ = ex.tokens(render, encode, eos, ex.Episode(prompt, "39", call, "39", train_call=True))
    assert tokenizer.decode([i for i, label in zip(ids, labels) if label != ex.IGNORE]).startswith("<tool_call>")
    guess_ids, guess_labels, _ = ex.tokens(render, encode, eos, ex.Episode(prompt, "26"))
    assert tokenizer.decode([i for i, label in zip(guess_ids, guess_labels) if label != ex.IGNORE]) == "26<|im_end|>"
    [(snippet, snippet_labels, _)] = ex.call_snippets([(ids, labels, tool_start)], eos, random.Random(0), 1, 256)
    assert "<|im_start|>system" not in tokenizer.decode(snippet) and "3 quib?" in tokenizer.decode(snippet)
    assert len(snippet) == len(snippet_labels) and '"unit": "quib"' in tokenizer.decode(snippet)


def test_recurring_short_strings_only():
    assert ex.recurring_strings(["florp", "quib", "florp", 3, "a", "x" * 30]) == ["florp", "quib"]
    assert ex.recurring_strings([f"w{i}" for i in range(100)]) == []  # not categorical: no tokens


# ---- planned, built, reused ---------------------------------------------------------------------------------------


def test_the_plan_points_the_run_at_a_folder_named_by_its_content(task, tiny_model_dir):
    cfg = planned(task, tiny_model_dir)
    folder = cfg.model.name_or_path
    assert folder.startswith(str(task / "cache" / "models" / "warmstart-"))
    assert cfg.model.builder == "agrpo.agents.warmstart.build_warm_model"
    assert cfg.agent.warmstart.base_model == str(tiny_model_dir)
    assert not (task / "cache").exists()  # planning writes nothing: the spec travels in the config
    from agrpo.agents.warmstart import planned_spec

    spec = planned_spec(cfg.model)
    assert len(spec["rows"]) == 6 and spec["rows"][0]["qty"] == 2 and spec["settings"]["tool"] == "convert"
    from agrpo.agents.warmstart import plan_warmstart

    assert plan_warmstart(cfg).model.name_or_path == folder  # planned once: a Job's uploaded config stays as it is
    assert planned(task, tiny_model_dir).model.name_or_path == folder  # same content, same folder
    assert planned(task, tiny_model_dir, "agent.warmstart.steps=3").model.name_or_path != folder
    assert planned(task, tiny_model_dir, "agent.warmstart.rows=5").model.name_or_path != folder
    (task / "units.py").write_text(UNITS_PY.replace('"quib": 13', '"quib": 14'))
    assert planned(task, tiny_model_dir).model.name_or_path != folder  # the tool's source changed


def test_the_runs_chat_template_kwargs_reach_the_examples_and_name_another_folder(task, tiny_model_dir):
    """The examples are rendered as training renders the run's turns, `trainer.extra.chat_template_kwargs` included
    (a Qwen3 run with `{enable_thinking: false}` would otherwise warm-start on prompts it never sees); a run without
    them keeps the folder it had."""
    from transformers import AutoTokenizer

    from agrpo.agents.warmstart import example_rows, planned_spec

    kwargs = "+trainer.extra.chat_template_kwargs={enable_thinking: false}"
    plain, switched = planned(task, tiny_model_dir), planned(task, tiny_model_dir, kwargs)
    assert "chat_template_kwargs" not in planned_spec(plain.model)["base"]
    assert planned_spec(switched.model)["base"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert switched.model.name_or_path != plain.model.name_or_path
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template += "{%- if enable_thinking is defined and enable_thinking is false %}NO-THINK{%- endif %}"
    prompt = [{"role": "user", "content": "How many zorbs is 3 quib?"}]
    episode = ex.Episode(prompt, "39")
    [(with_kwargs, _, _)] = example_rows(tokenizer, [episode], [], {"enable_thinking": False})
    [(without, _, _)] = example_rows(tokenizer, [episode], [], None)
    assert "NO-THINK" in tokenizer.decode(with_kwargs) and "NO-THINK" not in tokenizer.decode(without)


def test_the_build_calls_the_tool_for_real_and_is_reused(task, tiny_model_dir, monkeypatch):
    from agrpo.agents import warmstart
    from agrpo.models.resolve import prepare_model

    cfg = planned(task, tiny_model_dir)
    episodes, values, _ = warmstart.played(warmstart.planned_spec(cfg.model))
    assert episodes[0].call == {"name": "convert", "arguments": {"amount": 2, "unit": "florp"}}
    assert episodes[0].output == "14" and episodes[0].answer == "14" and "florp" in values
    path = prepare_model(cfg.model)
    assert path == cfg.model.name_or_path and warmstart.read_spec(Path(path)) == warmstart.planned_spec(cfg.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert "florp" in tokenizer.get_vocab() and "<tool_call>" in tokenizer.get_vocab()  # the toy's single tokens
    from agrpo.agents.tools import GuardedTool

    tool = GuardedTool("units.py:convert", {}, 30.0, 64).method  # as TRL's rollout worker passes it
    prompt = [{"role": "user", "content": "How many zorbs is 2 florp?"}]
    ids = tokenizer.apply_chat_template(prompt, tools=[tool], add_generation_prompt=True, return_dict=False)
    assert len(ids) < 60  # the tool list is one token, as the rollout renders it (byte by byte: over 700)
    monkeypatch.setattr(warmstart, "train", lambda *a, **k: pytest.fail("a cached warm start was trained again"))
    assert prepare_model(cfg.model) == path


def test_a_tool_that_fails_on_the_rows_arguments_is_one_paragraph(task, tiny_model_dir):

    from agrpo.agents import warmstart

    cfg = planned(task, tiny_model_dir, "+agent.warmstart.arguments.unit=answer")
    with pytest.raises(ConfigError, match=r"agent.warmstart: tool convert\(.*\) raised KeyError: .*on a data row"):
        warmstart.played(warmstart.planned_spec(cfg.model))
    with pytest.raises(ConfigError, match=r"agent.warmstart.tool='search': the run's tools are \['convert'\]"):
        planned(task, tiny_model_dir, "agent.warmstart.tool=search")


def test_warmstart_ranges_are_checked():
    from agrpo.agents.checks import warmstart_problems

    ok = {"enabled": True, "call_share": 0.15, "rows": 64, "steps": 120, "batch_size": 8, "learning_rate": 3e-3}
    assert warmstart_problems(ok) == [] and warmstart_problems({**ok, "enabled": False, "rows": 0}) == []
    assert warmstart_problems({**ok, "call_share": 1.0, "steps": 0}) == [
        "agent.warmstart.call_share=1.0 must be in (0, 1)",
        "agent.warmstart.steps=0 must be >= 1",
    ]


SIZE_PY = '''
def size(unit: str) -> str:
    """How big a unit is.

    Args:
        unit: The unit.
    """
    return "big" if unit == "quib" else "small"
'''


def test_with_several_tools_the_examples_call_each_in_turn(task, tiny_model_dir):

    from agrpo.agents import warmstart

    (task / "sizes.py").write_text(SIZE_PY)

    def calls(*overrides):
        cfg = planned(task, tiny_model_dir, "agent.tools=[units.py:convert,sizes.py:size]", *overrides)
        spec = warmstart.planned_spec(cfg.model)
        episodes, _, schemas = warmstart.played(spec)
        return spec, [e.call for e in episodes if e.call], [s["function"]["name"] for s in schemas]

    spec, made, schemas = calls()
    assert spec["settings"]["tool"] == ["convert", "size"] and schemas == ["convert", "size"]
    assert made[:3] == [
        {"name": "convert", "arguments": {"amount": 2, "unit": "florp"}},  # `amount: qty` is convert's alone
        {"name": "size", "arguments": {"unit": "quib"}},  # its own column name
        {"name": "convert", "arguments": {"amount": 4, "unit": "florp"}},
    ]
    _, made, _ = calls("+agent.warmstart.arguments.size={unit: answer}")  # one tool's own mapping wins
    assert made[1] == {"name": "size", "arguments": {"unit": 39}} and made[0]["arguments"]["unit"] == "florp"
    _, made, _ = calls("agent.warmstart.tool=size", "~agent.warmstart.arguments.amount")
    assert {call["name"] for call in made} == {"size"}
    with pytest.raises(ConfigError, match=r"names \['amount'\], which no tool the examples call takes"):
        calls("agent.warmstart.tool=size")  # `amount: qty` is for convert, which is no longer called
    with pytest.raises(ConfigError, match=r"arguments names \['size.amount'\], which no tool the examples call"):
        calls("+agent.warmstart.arguments.size={amount: qty}")


def test_the_planned_spec_survives_the_runs_config_yaml_whatever_its_rows_hold(tmp_path):
    """model.builder_input travels in config.yaml: a row's `${x}` or `$5` must not read as an interpolation."""
    from agrpo.agents.warmstart import planned_spec, spec_text
    from agrpo.config.prepare import prepare_overrides
    from agrpo.config.spec import load_spec, spec_yaml, with_values

    spec = {"rows": [{"prompt": 'costs ${x} or $5, "quoted" \\ slash', "n": [1, 2]}], "seed": 3}
    run = prepare_overrides(["+recipe=smoke"], output_dir=str(tmp_path / "run"), check_environment=False)
    (tmp_path / "config.yaml").write_text(spec_yaml(with_values(run, {"model.builder_input": spec_text(spec)})))
    assert planned_spec(load_spec(tmp_path / "config.yaml").model) == spec
