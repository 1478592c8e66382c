"""The data check sees the prompt training sends (agrpo/agents/prompt_budget.py through agrpo/config/data_checks.py).

Issue 32: a user's own tool task passed the dry run (its rows rendered without the tool list: 181 tokens) and failed
nine minutes into the real run (rendered with it: 1,042 tokens > max_model_len 1,024). Here the same kind of task, a
tool file and a JSONL of the user's, with the real tiny tokenizer (byte-level, so the tool list is long), is refused
before anything starts, with the keys to change; and the budget of the longest episode is checked too.
"""

from __future__ import annotations

import json

import pytest

from agrpo.agents.prompt_budget import Budget, cut_answer_tokens
from agrpo.config.compose import compose_run_config
from agrpo.config.data_checks import opened_data_problems

RECIPE = """
defaults:
  - override /model: tiny
  - override /data: jsonl
  - override /agent: none
run_name: converter
data:
  path: train.jsonl
  prompt_template: "Convert {amount} blorps to zinks."
agent:
  tools: [convert.py:blorps_to_zinks]
reward:
  funcs:
    - _target_: agrpo.rewards.generic.numeric_match
      column: answer
trainer:
  max_completion_length: 32
inference:
  max_model_len: 1024
"""

CONVERT = '''
def blorps_to_zinks(amount: float) -> float:
    """Convert blorps, a made-up unit, to zinks.

    Args:
        amount: How many blorps.
    """
    return amount * 3.7
'''


@pytest.fixture()
def own_tool_task(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    rows = [{"amount": i, "answer": round(i * 3.7, 2)} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "convert.py").write_text(CONVERT)
    (tmp_path / "converter.yaml").write_text(RECIPE)
    return tmp_path


def problems(task, tiny_model_dir, *overrides: str) -> list[str]:
    from agrpo.cli import expand_recipe_paths

    argv = ["+recipe=converter.yaml", f"model.name_or_path={tiny_model_dir}", *overrides]
    return opened_data_problems(compose_run_config(expand_recipe_paths(argv), output_dir=str(task / "run")))


def prompt_tokens(found: str) -> int:
    import re

    return int(re.search(r"prompt (?:at .+? )?is (\d+) tokens", found)[1])


def test_rows_are_measured_with_the_tool_list_as_training_renders_them(own_tool_task, tiny_model_dir):
    alone = problems(own_tool_task, tiny_model_dir, "agent.tools=[]", "inference.max_model_len=64")
    assert len(alone) == 1 and "trainer.max_completion_length=32 = 32" in alone[0]  # the plain check: no tools
    found = problems(own_tool_task, tiny_model_dir, "inference.max_model_len=600")
    assert len(found) == 1, found
    with_tools = prompt_tokens(found[0])
    assert with_tools > 4 * prompt_tokens(alone[0])  # the tool list is most of the prompt
    assert "with the list of 1 tool [prompt 'Convert " in found[0]
    assert found[0].startswith("line ") and "train.jsonl's prompt is" in found[0]  # the file's line, not an index
    assert f"with trainer.max_completion_length=32 that is {with_tools + 32} tokens" in found[0]
    assert "vLLM would refuse the first turn of every episode of this row" in found[0]
    for key in ("inference.max_model_len", "trainer.max_completion_length"):
        assert f"{key}" in found[0].split("Raise ")[1]


def test_the_longest_episode_must_fit_too_naming_every_key(own_tool_task, tiny_model_dir):
    fits = "inference.max_model_len=2048"  # the first turn fits; four tool answers of 2000 characters do not
    found = problems(own_tool_task, tiny_model_dir, fits, "agent.max_tool_calling_iterations=4")
    assert len(found) == 1 and found[0].startswith("an episode can need "), found
    assert "5 model turns x trainer.max_completion_length=32 and 4 tool rounds" in found[0]
    # counted with the tiny model's byte-level tokenizer (a token per character) and the cut marker: 2000 + 81
    assert (
        "(2081 tokens of an answer cut at agent.max_tool_output_chars=2000 with its marker, counted with " in found[0]
    )
    for key in ("max_model_len", "max_tool_calling_iterations", "max_tool_output_chars", "max_completion_length"):
        assert key in found[0].split("Raise ")[1]
    # A cap that fits: the same task passes.
    assert problems(own_tool_task, tiny_model_dir, fits, "agent.max_tool_output_chars=100") == []
    assert (
        problems(own_tool_task, tiny_model_dir, fits, "agent.max_tool_calling_iterations=null") == []
    )  # no bound: no check


def budget(**changes) -> Budget:
    values = dict(
        prompt=300,
        row="row 7",
        row_text="prompt hi",
        tools=2,
        completion=100,
        rounds=2,
        round_overhead=10,
        tool_output_chars=400,
        tool_output=100,
        max_model_len=1024,
    )
    return Budget(**{**values, **changes})


def test_the_budget_of_an_episode():
    assert budget().episode == 300 + 3 * 100 + 2 * (10 + 100)  # 820
    assert budget().problem() is None
    assert budget(max_model_len=819).problem().startswith("an episode can need 820 tokens, more than ")
    assert budget(tool_output_chars=None, tool_output=None).episode is None and budget(rounds=None).problem() is None
    first = budget(max_model_len=399).problem()
    assert first.startswith("row 7's prompt is 300 tokens with the list of 2 tools [prompt hi]; ")
    assert "that is 400 tokens, more than inference.max_model_len=399" in first


def smoke_config(tiny_model_dir, tmp_path, *overrides: str):
    from agrpo.cli import expand_recipe_paths

    argv = ["+recipe=agent_smoke", f"model.name_or_path={tiny_model_dir}", *overrides]
    return compose_run_config(expand_recipe_paths(argv), output_dir=str(tmp_path / "run"))


def test_a_pending_warm_start_is_checked_with_the_tokens_it_will_add(tiny_model_dir, tmp_path):
    """Issue 32 (audit): agent_smoke's warm start used to skip the check; now its rows are counted with the base
    tokenizer plus the warm start's tool tokens (the tool list is one token), an upper bound on the warm model's."""
    assert smoke_config(tiny_model_dir, tmp_path).agent.warmstart.enabled
    assert opened_data_problems(smoke_config(tiny_model_dir, tmp_path)) == []  # the recipe's own 384 fits
    found = opened_data_problems(smoke_config(tiny_model_dir, tmp_path, "inference.max_model_len=100"))
    assert len(found) == 1 and "more than inference.max_model_len=100" in found[0], found
    assert "with the list of 1 tool [prompt 'Find the secret word of " in found[0]
    warm = prompt_tokens(found[0])
    assert warm + 48 > 100 and warm < 100  # counted as the warm model will count it: far below the base tokenizer's
    cold = opened_data_problems(
        smoke_config(tiny_model_dir, tmp_path, "inference.max_model_len=100", "agent.warmstart.enabled=false")
    )
    assert prompt_tokens(cold[0]) > 8 * warm  # the same row with the tool list in bytes
    long_episode = ["agent.max_tool_output_chars=2000", "agent.max_tool_calling_iterations=2"]
    found = opened_data_problems(smoke_config(tiny_model_dir, tmp_path, *long_episode))
    assert len(found) == 1 and found[0].startswith("an episode can need "), found


def test_the_warm_start_check_is_an_upper_bound_on_the_warm_tokenizer(tiny_model_dir, tmp_path):
    """The tokenizer the warm model will have (every token the build adds, the tools' real answers included) counts
    no more than the check did."""
    from agrpo.agents.build import Agent
    from agrpo.agents.prompt_budget import AgentPrompts
    from agrpo.agents.warmstart import check_tokenizer, played, sample_rows, spec_of, toy_tokens
    from agrpo.config.data_checks import local_tokenizer
    from agrpo.data.sample import load_sample

    cfg = smoke_config(tiny_model_dir, tmp_path)
    dataset = load_sample(cfg.data, seed=cfg.trainer.seed, keep_origin=False).select(range(32))
    _, values, schemas = played(spec_of(cfg, sample_rows(cfg, 64)))
    warm = local_tokenizer(cfg.model)
    warm.add_tokens(toy_tokens(warm, schemas, values))
    checked = AgentPrompts(cfg, dataset, check_tokenizer(cfg, local_tokenizer(cfg.model)), Agent.from_config(cfg.agent))
    built = AgentPrompts(cfg, dataset, warm, Agent.from_config(cfg.agent))
    lengths = [(built.length(i), checked.length(i)) for i in range(len(dataset))]
    assert all(real <= bound for real, bound in lengths), lengths
    assert any(real < bound for real, bound in lengths)  # the values' tokens are left out of the bound


def test_a_cut_answer_is_counted_with_the_models_tokenizer_and_its_marker(tiny_model_dir):
    """Issue 46: the check counted ~4 characters per token and no marker, and agent_smoke's cap of 64 let an episode
    reach 409 tokens of its 384 at run time. The tiny tokenizer takes a token per character, the marker included."""
    from transformers import AutoTokenizer

    from agrpo.agents.tools import capped

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for cap in (16, 64, 2000):
        cut = capped("x" * 10**9 if cap == 16 else "y" * (cap + 123456789), cap)
        assert cut_answer_tokens(tokenizer, cap) >= len(tokenizer.encode(cut, add_special_tokens=False))
        assert cut_answer_tokens(tokenizer, cap) == len(cut) + 1  # a token per character; one more digit counted
    assert cut_answer_tokens(tokenizer, 64) == 143  # not 16: 64 characters and a 79-character marker
