"""The trainer process's builders read the spec it loads from the run's config.yaml (agrpo/trainer/__main__.py's
`load_spec`): TRL's arguments, the adapter config, the data, the rewards, the agent, the console, the adapter store.
The whole trainer runs against real vLLM replicas in tests/e2e (marked vllm); here every builder up to TRL's
trainer gets the frozen spec it will get there, without a server."""

from __future__ import annotations

import pytest

from agrpo.config.spec import load_spec, spec_yaml
from tests.specs import spec_for


@pytest.fixture(params=["smoke", "agent_smoke"])
def loaded(request, tmp_path):
    """(the prepared spec, the one the trainer process loads back from the run dir's config.yaml)."""
    prepared = spec_for(f"+recipe={request.param}", output_dir=str(tmp_path / "run"), cuda=False)
    (tmp_path / "config.yaml").write_text(spec_yaml(prepared))
    return prepared, load_spec(tmp_path / "config.yaml")


def test_the_trainer_builds_from_the_loaded_spec(loaded):
    from types import SimpleNamespace

    from agrpo.agents.build import Agent, prepare_agent
    from agrpo.data import load_train_dataset
    from agrpo.rewards.registry import build_reward_funcs
    from agrpo.sync import get_store
    from agrpo.trainer.console.callback import ConsoleCallback
    from agrpo.trainer.trl_backend import build_grpo_args, build_peft_config, is_paced

    prepared, cfg = loaded
    assert cfg == prepared
    args = build_grpo_args(cfg, "http://127.0.0.1:9", num_replicas=1, use_gpu=False)
    assert (args.bf16, args.queue_maxsize, args.max_steps) == (False, cfg.trainer.queue_maxsize, cfg.trainer.max_steps)
    assert build_peft_config(cfg.lora).r == cfg.lora.r
    dataset = load_train_dataset(cfg.data, seed=cfg.trainer.seed)
    assert "prompt" in dataset.column_names and len(dataset) > 0
    assert [reward.weight for reward in build_reward_funcs(cfg.reward.funcs)] == [
        term.get("weight", 1.0) for term in cfg.reward.funcs
    ]
    agent = Agent.from_config(cfg.agent)
    holder = SimpleNamespace()
    kwargs = prepare_agent(cfg, holder)
    assert (agent is None) == (kwargs == {}) and (agent is None or holder.max_tool_calling_iterations >= 1)
    assert ConsoleCallback(cfg, num_replicas=1).run_dir == str(cfg.sync.output_dir)
    assert get_store(cfg).kind == cfg.sync.kind and is_paced(cfg)
