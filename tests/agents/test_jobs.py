"""Tool, environment and reward files of the launching machine travel to a Jobs run (agrpo/launchers/hf_jobs/
code_inputs.py through inputs.py): planned as inputs, printed by the dry run, named by the trainer Job's config, and
loadable from their copies. Planning only: the upload itself is the executor's, tested in tests/launchers."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from agrpo.agents.build import Agent
from agrpo.errors import ConfigError
from agrpo.launchers.hf_jobs.inputs import upload_pairs
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for

JOBS = ["launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1", "launcher.hf_jobs.namespace=alice"]
PINNED = "launcher.hf_jobs.install='agrpo==0.1.0'"  # no wheel build: these tests are about the inputs
CODE = [
    "agent=none",
    'agent.tools=["my_tools.py:search", "my_tools.add"]',  # a file, and a module in the working directory
    'agent.environment={_target_: "my_env.py:Counter", start: 2}',
    'reward.funcs=[{_target_: "my_rewards.py:score", weight: 0.5}]',
]


def plan_for(*overrides):
    return build_jobs_plan(spec_for("+recipe=agent_smoke", *JOBS, *overrides, PINNED), launch_id="L1")


@pytest.fixture()
def rewards_file(user_code):
    (user_code / "my_rewards.py").write_text(
        "def score(completions, **columns):\n    return [1.0] * len(completions)\n"
    )
    return user_code


def test_code_files_are_planned_printed_and_named_in_the_jobs_config(rewards_file):
    plan = plan_for(*CODE)
    code = {item.key: item for item in plan.inputs if "/inputs/code/" in item.job_path}
    assert set(code) == {"agent.tools.0", "agent.tools.1", "agent.environment._target_", "reward.funcs.0._target_"}
    job = OmegaConf.create(plan.config.text)
    assert job.agent.tools[0].endswith("/my_tools.py:search") and job.agent.tools[1].endswith("/my_tools.py:add")
    assert job.agent.environment._target_.endswith("/my_env.py:Counter") and job.agent.environment.start == 2
    assert job.reward.funcs[0]._target_.endswith("/my_rewards.py:score") and job.reward.funcs[0].weight == 0.5
    assert all(item.job_path.startswith("/bucket/run1/inputs/code/") for item in code.values())
    assert str(rewards_file) not in plan.config.text  # nothing in the Jobs points at this machine
    shown = plan.render()
    for item in code.values():
        assert f"upload {item.key}={item.source} " in shown and f"(the Jobs read {item.job_path})" in shown
    assert plan.replicas[0].command[:2] == ["vllm", "serve"]  # replicas get no code: tools run in the trainer Job


def test_the_trainer_job_loads_the_tools_from_their_copies(rewards_file, tmp_path_factory, monkeypatch):
    """Copy each file to where the upload puts it under a stand-in for the bucket mount, then build the agent from
    the Job's config in another working directory: every tool and the environment load from the copies."""
    plan = plan_for(*CODE)
    bucket = tmp_path_factory.mktemp("bucket")
    for item in plan.inputs:
        if "/inputs/code/" in item.job_path:
            for source, destination in upload_pairs(item):
                (bucket / destination).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, bucket / destination)
    job = OmegaConf.create(plan.config.text.replace("/bucket/", f"{bucket}/"))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    agent = Agent.from_config(job.agent)
    assert [tool.method(query="x") if tool.name == "search" else tool.method(a=1, b=2) for tool in agent.tools] == [
        "3 notes about x",
        3,
    ]
    assert agent.environment().increment(by=1) == 3


def test_a_package_in_the_working_directory_is_refused_naming_its_key(user_code):
    (user_code / "helpers").mkdir()
    (user_code / "helpers" / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match=r"agent.tools.0='helpers.search' is a package in the working directory"):
        plan_for('agent.tools=["helpers.search"]')


def test_installed_code_stays_as_it_is():
    plan = plan_for()  # agent_smoke names only agrpo's own code, which the wheel carries
    assert not [item for item in plan.inputs if "/inputs/code/" in item.job_path]
    job = OmegaConf.create(plan.config.text)
    assert job.agent.environment._target_ == "agrpo.agents.secret_word.SecretWordEnv"
