"""The agent checks of the one validation pass (agrpo/agents/checks.py): each bad input is refused before anything
starts, in a sentence naming the key to change; the shipped agent recipe passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import validate
from agrpo.errors import ConfigError


def problems_of(*overrides: str) -> str:
    cfg = compose_run_config(["+recipe=agent_smoke", *overrides], output_dir="/tmp/agrpo-agent-checks")
    with pytest.raises(ConfigError) as raised:
        validate(cfg)
    return str(raised.value)


def test_the_agent_recipe_and_its_tool_variant_pass():
    for extra in ([], ["agent=secret_word_tool"]):
        validate(compose_run_config(["+recipe=agent_smoke", *extra], output_dir="/tmp/agrpo-agent-checks"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (['agent.tools=["nowhere.py:search"]'], "agent.tools[0]='nowhere.py:search' cannot be loaded as a tool"),
        (
            ['agent.tools=["my_tools.py:undocumented"]'],
            "agent.tools[0]: TRL cannot describe 'undocumented' to the model",
        ),
        (['agent.environment={_target_: "my_env.py:NoReset"}'], "NoReset has no `reset` method, which TRL requires"),
        (
            ['agent.environment={_target_: "my_env.py:Quiet"}', "reward.funcs=[]"],
            "reward.funcs is empty and no agent.environment has a `get_reward` method",
        ),
        (
            ['agent.tools=["my_tools.py:search"]', "model.chat_template=llama3"],
            "does not render tool calls and tool messages: set model.chat_template to qwen2_5",
        ),
        (
            ["model.chat_template=qwen2_5_training"],
            "TRL cannot parse tool calls written in the model's chat template",
        ),
        (["agent.max_tool_calling_iterations=0"], "agent.max_tool_calling_iterations=0 must be >= 1"),
        (["agent.tool_timeout_s=-1"], "agent.tool_timeout_s=-1.0 must be > 0"),
        (
            ["+trainer.extra.max_tool_calling_iterations=3"],
            "trainer.extra.max_tool_calling_iterations duplicates agent.max_tool_calling_iterations",
        ),
    ],
)
def test_bad_agent_config_is_refused_naming_the_key(user_code, overrides, expected):
    assert expected in problems_of(*overrides)


def test_rows_must_name_environments_that_exist(user_code):
    rows = [{"prompt": "count", "environment": "counter"}, {"prompt": "look", "environment": "lookr"}]
    (user_code / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    several = 'agent.environment={counter: {_target_: "my_env.py:Counter"}, look: {_target_: "my_env.py:Quiet"}}'
    data = [
        "data.loader=agrpo.data.jsonl.load_jsonl",
        f"data.path={user_code / 'rows.jsonl'}",
        "data.shuffle=false",
        "data.max_prompts=null",
    ]
    assert "data row 1 has environment='lookr', which agent.environment does not define (it defines counter, look)" in (
        problems_of("agent=none", several, *data)
    )
    (user_code / "rows.jsonl").write_text(json.dumps({"prompt": "count"}) + "\n")
    assert "so each data row must pick one in an `environment` column" in problems_of("agent=none", several, *data)


def test_the_cli_exits_2_naming_the_key_in_a_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "agrpo", "+recipe=agent_smoke", 'agent.tools=["nowhere.py:search"]']
        + ["launcher.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "agent.tools[0]='nowhere.py:search' cannot be loaded as a tool" in result.stderr
    assert "Traceback" not in result.stderr


RECIPES = ["smoke", "gsm8k_cpu", "gsm8k", "sanity", "agent_smoke"]
GROUPS = [[], ["launcher=accelerate"], ["launcher=hf_jobs", "sync=bucket"], ["logger=wandb"], ["model=qwen2_5_0_5b"]]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("groups", GROUPS, ids=lambda g: "+".join(g) or "defaults")
def test_the_agent_group_composes_with_every_other_group(recipe, groups):
    """agent=secret_word on top of any recipe and any other group's option: composed, and the config-only checks
    (the agent's included) find nothing of the agent's to refuse."""
    from agrpo.agents.checks import agent_problems
    from agrpo.config.validate import find_problems

    cfg = compose_run_config([f"+recipe={recipe}", *groups, "agent=secret_word"], output_dir="/tmp/agrpo-compose")
    assert cfg.agent.environment["_target_"] == "agrpo.agents.secret_word.SecretWordEnv"
    assert not [p for p in find_problems(cfg) + agent_problems(cfg, check_environment=False) if "agent" in p]
