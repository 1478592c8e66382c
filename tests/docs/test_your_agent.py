"""docs/your_agent.md taken the way its reader copies it: the page's files (`# my_tools.py`, `# my_env.py`,
`# my_data.py`, `# my_rewards.py`, `# my_agent.yaml`) written to a folder exactly as printed, and its commands run
from there as printed.

What cannot run here, and what runs instead: training needs vLLM replicas, so each train command of section 7 runs
with `launcher.dry_run=true` appended (every check of section 6, against the tiny model, which the test puts in
AGRPO_CACHE so that the prompt and episode budgets are really counted). `agrpo eval` samples from a replica: its
section 8 commands run as printed (`$RUN` expanded by bash) through agrpo's own CLI, with only the serving step
replaced by a scripted endpoint that writes a `get_secret` call for the question's player (the adapter) or answers
at once (the base model); the rest (tools, environment, TRL's parser, rewards, summaries) is agrpo's. The trained
adapter is a random LoRA adapter of the tiny model in a run folder made here. `agrpo push --dry-run` then runs as
printed on that folder and both evaluations; a real push needs the Hub (tests/e2e/test_your_task_walk.py pushes to a
fake one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.guide import AGENT_GUIDE, commands, named_blocks, with_args

TRAIN = "python -m agrpo +recipe=my_agent.yaml"
WORDS = {"apple", "river", "stone"}


def shell(command: str, cwd: Path, expect: int = 0) -> subprocess.CompletedProcess:
    """`command` in bash, as a reader pastes it, with this Python's bin first on PATH (python, agrpo)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == expect, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture
def folder(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    """The reader's folder: the page's files as printed and its data script run; the tiny model in the cache."""
    for name, block in {**named_blocks("python", AGENT_GUIDE), **named_blocks("yaml", AGENT_GUIDE)}.items():
        (tmp_path / name).write_text(block)
    assert {"my_tools.py", "my_env.py", "my_data.py", "my_rewards.py", "my_agent.yaml"} <= {
        p.name for p in tmp_path.iterdir()
    }
    [make_data] = commands("python my_data.py", AGENT_GUIDE)
    shell(make_data, tmp_path)
    (tmp_path / "cache" / "models").mkdir(parents=True)
    (tmp_path / "cache" / "models" / "tiny-qwen2").symlink_to(tiny_model_dir)
    monkeypatch.setenv("AGRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def recipe_agent(folder: Path):
    from agrpo.agents.build import Agent

    return Agent.from_config(yaml.safe_load((folder / "my_agent.yaml").read_text())["agent"])


def test_the_printed_tool_environment_data_and_reward_work(folder):
    from transformers.utils import get_json_schema

    from agrpo.rewards.registry import build_reward_funcs

    agent = recipe_agent(folder)
    [search] = agent.tools
    assert list(get_json_schema(search.method)["function"]["parameters"]["properties"]) == ["query"]  # limit bound
    assert search.method(query="reveals").startswith("get_secret reveals it only")
    assert len(search.method(query="secret").splitlines()) == 2 and search.method(query="zebra") == "no note matches"

    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and len((folder / "test.jsonl").read_text().splitlines()) == 16
    row = rows[0]
    assert set(row) == {"prompt", "player"} and row["prompt"].endswith(f"player {row['player']}?")
    env = agent.environment()
    assert env.reset(**row) is None
    other = next(r["player"] for r in rows if r["player"] != row["player"])
    assert env.get_secret(player=other) == "no such player" and env.get_reward() == 0.0
    word = env.get_secret(player=f" {row['player'].lower()} ")
    assert word in WORDS and env.get_reward() == 1.0

    [reward] = build_reward_funcs([{"_target_": "my_rewards.py:answer_has_secret"}])
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_secret"}}]}
    episodes = [
        [call, {"role": "tool", "content": word}, {"role": "assistant", "content": f"It is {word}."}],
        [call, {"role": "tool", "content": "no such player"}, {"role": "assistant", "content": "no such player"}],
        [{"role": "assistant", "content": "It is apple."}],  # a guess without the tool
    ]
    prompt = [{"role": "user", "content": row["prompt"]}]
    scores = reward(completions=episodes, prompts=[prompt] * 3, completion_ids=[[1]] * 3, player=[row["player"]] * 3)
    assert scores == [1.0, 0.0, 0.0]


def train_commands() -> tuple[list[str], str]:
    """Section 7's train commands, and section 8's: the run into a folder the reader names (hydra.run.dir)."""
    lines = commands(TRAIN, AGENT_GUIDE)
    [named] = [line for line in lines if "hydra.run.dir=" in line]
    return [line for line in lines if line != named], named


def test_the_train_commands_pass_the_dry_run(folder):
    first, composed, *trains = train_commands()[0]
    assert first.startswith(f"{TRAIN} launcher.dry_run=true") and composed.startswith(f"{TRAIN} --cfg job")
    config = yaml.safe_load(shell(composed, folder).stdout)
    assert config["agent"]["tools"] == [{"_target_": "my_tools.py:search", "limit": 5}]
    assert config["agent"]["environment"] == {
        "_target_": "my_env.py:SecretWordEnv",
        "words": ["apple", "river", "stone"],
    }
    assert config["reward"]["funcs"][0]["_target_"] == "my_rewards.py:answer_has_secret"
    plans = [shell(first, folder).stdout] + [
        shell(with_args(c, "launcher.dry_run=true"), folder).stdout for c in trains
    ]
    assert len(plans) == 4 and all(p.startswith("agrpo plan (local)") for p in plans)
    assert "[replica] vllm-1" not in plans[1] and "[replica] vllm-1" in plans[2] and "[proxy]" in plans[2]
    assert "with agrpo.agents.warmstart.build_warm_model" in plans[3]  # the CPU line: a warm start for get_secret
    assert not (folder / "outputs").exists()  # a dry run leaves no run folder behind


def variant(folder: Path, old: str, new: str) -> str:
    text = (folder / "my_agent.yaml").read_text()
    assert text.count(old) == 1
    (folder / "broken.yaml").write_text(text.replace(old, new))
    return f"{TRAIN.replace('my_agent.yaml', 'broken.yaml')} launcher.dry_run=true"


def test_broken_recipes_are_refused_as_the_page_says(folder):
    """Section 6's errors: one paragraph, exit 2, naming the key; and the recipe's budget is the one that fits."""
    page = " ".join(AGENT_GUIDE.read_text().split())
    quoted = re.search(r"\(`(agent\.tools\[1\]='nowhere.py:search' cannot be loaded as a tool)`\)", page).group(1)
    bound = "      limit: 5\n"
    for old, new, error in [
        (bound, f"{bound}    - nowhere.py:search\n", quoted),
        (bound, f"{bound}    - my_tools.py:search\n", "agent.tools[1] is named 'search' like agent.tools[0]"),
        # the default cap (2000 characters) does not fit: the budget is counted on the tiny model's prompt
        ("max_tool_output_chars: 200 ", "max_tool_output_chars: 2000", "an episode can need"),
    ]:
        refused = shell(variant(folder, old, new), folder, expect=2)
        [paragraph] = refused.stderr.strip().splitlines()
        assert paragraph.startswith("agrpo: error: invalid config (1 problem): ") and refused.stdout == ""
        assert error in paragraph


class Scripted:
    """The replica's place: the adapter calls get_secret for the question's player, then answers with what the tool
    said; the base model answers at once. Replies in the tiny model's own tool-call format (qwen2_5's)."""

    def __init__(self, tokenizer, calls: bool):
        self.tokenizer, self.calls = tokenizer, calls

    def complete(self, model, prompt_ids, n, seed, params):
        text = self.tokenizer.decode(prompt_ids)
        said = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)
        if self.calls and not said:
            player = re.findall(r"player (\w+)\?", text)[-1]
            reply = '<tool_call>\n{"name": "get_secret", "arguments": {"player": "%s"}}\n</tool_call>' % player
        else:
            reply = f"The word is {said[-1] if said else 'apple'}."
        ids = self.tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        return [{"token_ids": ids, "finish_reason": "stop"}]


def scripted_serving(cfg, out_dir, lora, count, sampler):
    from transformers import AutoTokenizer

    endpoint = Scripted(AutoTokenizer.from_pretrained(cfg.model.name_or_path), calls=lora is not None)
    return [sampler(endpoint, lora or "base", i) for i in range(count)], lora or "base", "scripted"


def finished_run(folder: Path, adapter: Path, name: str) -> Path:
    """A run folder as training leaves it: final_adapter/ (a random LoRA adapter) and the resolved config.yaml."""
    from omegaconf import OmegaConf

    from agrpo.config.prepare import compose_overrides

    run = folder / name
    shutil.copytree(adapter, run / "final_adapter")
    config = compose_overrides(["+recipe=my_agent.yaml"])
    config.sync.output_dir = str(run)
    OmegaConf.save(config, run / "config.yaml", resolve=True)
    return run


def test_eval_and_push_run_as_printed(folder, random_adapter_dir, monkeypatch):
    from agrpo.eval import cli, runner

    monkeypatch.setattr(runner, "sample_served", scripted_serving)
    named_run = train_commands()[1]
    run_dir = re.search(r"hydra\.run\.dir=(\S+)", named_run).group(1)
    run = finished_run(folder, random_adapter_dir, run_dir)
    later = finished_run(folder, random_adapter_dir, "outputs/my_agent/2099-01-01_00-00-00")  # a later run's folder
    [find_run] = commands("RUN=", AGENT_GUIDE)
    assert shell(f"{find_run}\necho $RUN", folder).stdout.split()[-1] == run_dir != str(later.relative_to(folder))
    # the folder holds this run's adapter: a second run into it is refused, so $RUN is the run that wrote it
    refused = shell(with_args(named_run, "launcher.dry_run=true"), folder, expect=2)
    assert f"{run_dir} already holds an earlier run's outputs (final_adapter)" in refused.stderr, refused.stderr
    base, adapter = commands("agrpo eval ", AGENT_GUIDE)
    for line in (base, adapter):
        expanded = shell(f"{find_run}\nprintf '%s\\n' {line.split('  #')[0]}", folder).stdout.split()
        assert expanded[:2] == ["agrpo", "eval"] and cli.main(expanded[2:]) == 0
    base_summary = json.loads((folder / "outputs/my_agent/base_eval/eval_summary.json").read_text())
    summary = json.loads((run / "eval" / "eval_summary.json").read_text())
    assert base_summary["adapter"] is None and base_summary["agent"]["tool_calls_per_episode"] == 0.0
    assert base_summary["term_means"] == {"answer_has_secret": 0.0, "SecretWordEnv": 0.0}
    assert summary["adapter"].endswith(f"{run_dir}/final_adapter") and summary["problems"] == 16
    assert summary["agent"]["tool_calls_per_episode"] == 1.0 and summary["agent"]["turns_per_episode"] == 2.0
    assert summary["term_means"] == {"answer_has_secret": 1.0, "SecretWordEnv": 1.0}
    first = json.loads((run / "eval" / "eval_results.jsonl").read_text().splitlines()[0])
    assert re.match(
        r"\[assistant\] .*-> get_secret\(\{'player': '\w+'\}\)\n\[tool\] (apple|river|stone)\n", first["completions"][0]
    )

    [push] = commands("agrpo push ", AGENT_GUIDE)
    card = shell(f"{find_run}\n{push}", folder).stdout
    assert "| base model | 16 | 4 | 0.0000 |" in card and "| this adapter | 16 | 4 | 1.0000 |" in card
    assert "agrpo push: dry run, nothing uploaded. Would create my-agent-lora" in card


def test_the_cpu_recipe_names_the_test_rows_that_section_8_evaluates(folder):
    """Issue 46: section 4's CPU recipe had no eval.path, so section 8's `agrpo eval` on it stopped with `set
    eval.path to a test file`. The template as printed passes eval's own data check and names the test file that
    section 2's data script writes; without its eval lines, the same check refuses it."""
    from agrpo.config.eval_checks import eval_problems
    from agrpo.config.prepare import compose_overrides

    cpu = folder / "my_cpu_agent.yaml"
    assert cpu.is_file()
    cfg = compose_overrides(["+recipe=my_cpu_agent.yaml"])
    assert eval_problems(cfg, check_environment=False) == []
    assert (folder / cfg.eval.path).is_file() and cfg.eval.path != cfg.data.path
    lines = cpu.read_text().splitlines()
    at = lines.index("eval:")
    (folder / "no_eval.yaml").write_text("\n".join(lines[:at] + lines[at + 2 :]) + "\n")
    [problem] = eval_problems(compose_overrides(["+recipe=no_eval.yaml"]), check_environment=False)
    assert "is the training file: set eval.path to a test file" in problem
