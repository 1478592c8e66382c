"""The console's one-time notices (agrpo/trainer/console/notices.py) on step logs shaped as TRL logs them: a run with no
reward spread, an agent run that never calls its tool (issue 32: 192 episodes at 0.000 +- 0.000 and not a word), an
episode cut short by a refused turn, a tool answer cut at the cap; and the step line's tool figure."""

from __future__ import annotations

from agrpo.agents.metrics import CONTEXT_FULL_COUNTER, EPISODES, MALFORMED, TRUNCATED
from agrpo.trainer.console.callback import step_line
from agrpo.trainer.console.notices import NO_SIGNAL_STEPS, RunNotices, tool_calls_part


def notices(agent=True) -> RunNotices:
    return RunNotices(agent=agent, max_model_len=1024, max_tool_output_chars=2000)


def flat_step(**extra):
    return {"reward": 0.0, "reward_std": 0.0, EPISODES: 16.0, "tools/convert/call_total": 0.0, **extra}


def test_an_agent_run_without_tool_calls_or_reward_spread_says_so_once_after_n_steps():
    watch = notices()
    said = [watch.observe(flat_step(**{MALFORMED: 2.0})) for _ in range(NO_SIGNAL_STEPS + 3)]
    assert all(lines == [] for lines in said[: NO_SIGNAL_STEPS - 1])
    first = said[NO_SIGNAL_STEPS - 1]
    assert len(first) == 2 and all(len(lines) == 0 for lines in said[NO_SIGNAL_STEPS:])  # once each
    spread, tools = first
    assert spread.startswith(f"agrpo: for {NO_SIGNAL_STEPS} steps every episode of a prompt got the same reward")
    assert "trained nothing" in spread and "trainer.num_generations" in spread
    assert tools.startswith(f"agrpo: no tool call in {16 * NO_SIGNAL_STEPS} episodes over {NO_SIGNAL_STEPS} steps")
    assert f"({2 * NO_SIGNAL_STEPS} replies opened a tool call TRL could not parse" in tools
    assert "already tuned for tool calling" in tools and "agent.warmstart.enabled=true" in tools


def test_a_run_that_learns_says_nothing():
    watch = notices()
    for step in range(3 * NO_SIGNAL_STEPS):
        spread = 0.0 if step % NO_SIGNAL_STEPS else 0.4  # a flat step now and then is normal
        assert watch.observe(flat_step(reward_std=spread, **{"tools/convert/call_total": 3.0})) == []
    plain = notices(agent=False)
    assert [plain.observe({"reward": 0.5, "reward_std": 0.2, EPISODES: 16.0}) for _ in range(10)] == [[]] * 10


def test_cut_answers_are_named_once_with_the_key():
    watch = notices()
    lines = watch.observe({"reward": 1.0, "reward_std": 0.5, CONTEXT_FULL_COUNTER: 1.0, TRUNCATED: 3.0})
    assert len(lines) == 1  # a refused turn is said by the rollout child, at once (test_refused_turns.py)
    assert lines[0].startswith("agrpo: a tool answered more than agent.max_tool_output_chars=2000 characters")
    assert watch.observe({"reward": 1.0, "reward_std": 0.5, TRUNCATED: 1.0}) == []


def test_with_the_cap_lifted_the_cut_line_names_the_context_not_a_none_cap():
    watch = RunNotices(agent=True, max_model_len=384, max_tool_output_chars=None)
    [line] = watch.observe({"reward": 1.0, "reward_std": 0.5, TRUNCATED: 1.0})
    assert "inference.max_model_len=384 tokens" in line and "agent.max_tool_output_chars=null" in line
    assert "None" not in line


def test_the_step_line_shows_tool_calls_per_episode_in_agent_runs():
    logs = {"reward": 0.5, "reward_std": 0.1, EPISODES: 16.0, "tools/a/call_total": 6.0, "tools/b/call_total": 2.0}
    assert tool_calls_part(logs) == "tools 0.50/episode"
    assert step_line(logs, 3, 10).endswith("  tools 0.50/episode")
    assert tool_calls_part({"reward": 0.5}) is None and "tools" not in step_line({"reward": 0.5}, 3, 10)


def test_the_end_says_whether_the_run_was_still_without_a_signal():
    watch = notices()
    for _ in range(NO_SIGNAL_STEPS):
        watch.observe(flat_step())
    assert watch.no_signal() == f"no tool call in {16 * NO_SIGNAL_STEPS} episodes"
    watch.observe(flat_step(**{"tools/convert/call_total": 2.0}))  # a call: the spread is what is left to judge
    assert watch.no_signal() == f"reward spread 0 within every prompt's group in the last {NO_SIGNAL_STEPS + 1} steps"
    watch.observe(flat_step(reward_std=0.3))
    assert watch.no_signal() is None  # its last step learnt
    plain = notices(agent=False)
    for _ in range(NO_SIGNAL_STEPS - 1):
        plain.observe({"reward": 0.0, "reward_std": 0.0})
    assert plain.no_signal() is None  # fewer than NO_SIGNAL_STEPS flat steps
