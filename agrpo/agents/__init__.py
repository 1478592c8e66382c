"""Agents: tools and environments from the `agent:` config, run in the rollout worker (docs/your_agent.md).

tools.py and environments.py build what TRL takes (picklable, guarded); checks.py is the validation pass's part;
build.py hands TRL its arguments; metrics.py counts where each turn of an episode was served (the trainer's rollout
loop measures it: agrpo/trainer/rollout/episode.py); secret_word.py is the agent_smoke task; warmstart.py (with
warmstart_examples.py) teaches a small model to call a run's own tools before training (`agent.warmstart`). Below the config (docs/architecture.md): the validation pass
loads and checks the user's tools and environments here, as it does rewards in agrpo/rewards/. The code files a Jobs
run uploads are listed by agrpo/launchers/hf_jobs/code_inputs.py.
"""
