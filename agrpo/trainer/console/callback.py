"""What the trainer shows on the terminal (where everything else goes: agrpo/trainer/console/logs.py).

- `quiet_trainer`: removes transformers' callbacks that print every step's metric dict.
- `ConsoleCallback`: a start banner, a progress bar, one compact line every `logger.console_every` steps and an end
  summary with the next commands. The formatting is pure (`step_line`, `run_summary`, `summary_lines`, ...) and
  tested on real log values; the callback only feeds it.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from statistics import fmean
from typing import Any, TextIO

from transformers import TrainerCallback

from agrpo.config.schema import RunConfig
from agrpo.plot import CALLS_PER_EPISODE, CURVES_PNG
from agrpo.trainer.console.bottleneck import accounting_line, sample_accounting, stale_share
from agrpo.trainer.console.events import RETIRED_DROPPED, WORKER_RESENT, ConsoleEvents, requests_figures, requests_line
from agrpo.trainer.console.logs import CONSOLE_LOGGER, level_number, current_log_file
from agrpo.trainer.console.notices import RunNotices, tool_calls_part

TENSORBOARD_DIR = "tensorboard"  # as trl_backend.TENSORBOARD_DIR (importing it here would import TRL)


def quiet_trainer(trainer: Any) -> None:
    """Remove transformers' callbacks that print each step's metric dict (ProgressCallback's bar and on_log,
    PrinterCallback when the bar is off); ConsoleCallback draws the bar and the compact lines instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (ProgressCallback, PrinterCallback):
        while any(isinstance(c, callback) for c in trainer.callback_handler.callbacks):
            trainer.remove_callback(callback)


# ---- pure formatting --------------------------------------------------------------------------------------------


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)


def step_line(logs: dict[str, Any], step: int, total: int) -> str:
    """One step's metrics in one line: reward mean +- std, KL, completion length, step time, stale share, sync."""
    width = len(str(total))
    share = stale_share([logs])
    parts = [
        f"step {step:>{width}}/{total}",
        f"reward {_num(logs.get('reward'), '.3f')} ± {_num(logs.get('reward_std'), '.3f')}",
        f"kl {_num(logs.get('kl'), '.4f')}",
        f"len {_num(logs.get('completions/mean_length'), '.1f')}",
        f"{_num(logs.get('perf/step_s'), '.2f')} s/step",
        f"stale {'-' if share is None else format(share, '.0%')}",
        f"sync {_num(logs.get('perf/weight_sync_s'), '.2f')} s",
    ]
    tools = tool_figure(logs)
    parts += [tools] if tools else []
    resent, dropped = logs.get(WORKER_RESENT), logs.get(RETIRED_DROPPED)
    if resent or dropped:  # each one is a line in trainer.log (trainer/rollout/client.py, loop.py); totals: the summary
        parts.append(f"re-sent {int(resent or 0)}, groups dropped {int(dropped or 0)} (trainer.log)")
    return "  ".join(parts)


def tool_figure(logs: dict[str, Any]) -> str | None:
    """`tools 0.12/episode` for an agent run's step line: the logged `tools/call_frequency` itself (TRL's, over the
    samples this step trained; agrpo logs it at 0 in a step without calls: agrpo/trainer/rollout/scorer.py), so the line
    and TensorBoard say the same. Issue 46: the line counted the calls started in the logging window over its
    episodes instead (0.10 where 0.125 was logged); that count remains only for logs without the metric."""
    logged = logs.get(CALLS_PER_EPISODE)
    if isinstance(logged, (int, float)):
        return f"tools {float(logged):.2f}/episode"
    return tool_calls_part(logs)


def line_due(step: int, every: int, since_last_s: float, every_s: float) -> bool:
    """Whether a step gets its compact line: every `every` steps, the first step, and after `every_s` seconds without
    one (a slow run shows its pace early instead of after `every` long steps)."""
    return step % every == 0 or step == 1 or since_last_s >= every_s


def run_summary(log_history: list[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """Figures of a whole run from TRL's log history: rewards of the first and last `window` steps, steps/s and
    trained tokens/s over the training wall time, and the share of generated samples dropped as stale."""
    steps = [e for e in log_history if "perf/step_s" in e or "reward" in e]
    rewards = [float(e["reward"]) for e in steps if e.get("reward") is not None]
    runtime = next((float(e["train_runtime"]) for e in reversed(log_history) if "train_runtime" in e), None)
    if runtime is None:
        runtime = sum(float(e.get("perf/step_s") or 0.0) for e in steps) or None
    tokens = sum(float(e.get("batch/trained_tokens_per_step") or 0.0) for e in steps)
    summary: dict[str, Any] = {
        "steps": max((int(e.get("step", 0)) for e in steps), default=len(steps)),
        "runtime_s": runtime,
        "stale_share": stale_share(steps),
        "samples": sample_accounting(steps),
        "requests": requests_figures(steps),
    }
    if rewards:
        summary["reward_first"] = fmean(rewards[:window])
        summary["reward_last"] = fmean(rewards[-window:])
    terms = sorted({key.removeprefix("rewards/") for e in steps for key in e if key.startswith("rewards/")})
    summary["terms"] = {}
    for name in terms:  # TRL's rewards/<name>: the term's mean score times its weight (agrpo weights inside)
        values = [float(e[f"rewards/{name}"]) for e in steps if e.get(f"rewards/{name}") is not None]
        if values:
            summary["terms"][name] = (fmean(values[:window]), fmean(values[-window:]))
    if runtime:
        summary["steps_per_s"] = summary["steps"] / runtime
        summary["tokens_per_s"] = tokens / runtime if tokens else None
    return summary


def eval_overrides(overrides: list[str]) -> list[str]:
    """Of a run's Hydra overrides, those that say what was trained (recipe, model, LoRA shape, data, reward):
    `agrpo eval` composes the same config tree, so repeating them evaluates on the same task and prompts, with
    replicas sized for the adapter's rank."""
    keep = ("+recipe=", "recipe=", "model", "+model", "lora", "+lora", "data", "+data", "reward", "+reward")
    return [o for o in overrides if o.startswith(keep)]


def banner_lines(
    *,
    run_dir: str,
    model: str,
    lora_rank: int,
    max_steps: int,
    replicas: int,
    vllm_url: str | None,
    log_file: str | None,
    report_to: list[str],
    attention: str | None = None,
) -> list[str]:
    where = f" behind {vllm_url}" if vllm_url else ""
    lines = [
        f"agrpo: training {model} (LoRA r={lora_rank}) for {max_steps} steps on {replicas} replica(s){where}",
        f"  run dir      {run_dir}",
    ]
    if attention:
        lines.append(f"  attention    {attention}")
    if log_file:
        lines.append(f"  full log     {log_file}")
    if "tensorboard" in report_to:
        board = str(Path(run_dir) / TENSORBOARD_DIR)
        lines.append(f"  TensorBoard  {board}  (tensorboard --logdir {shlex.quote(board)})")
    others = [name for name in report_to if name not in ("tensorboard", "none")]
    if others:
        lines.append(f"  also logging to {', '.join(others)}")
    return lines


def reward_lines(summary: dict[str, Any], weights: dict[str, float]) -> list[str]:
    """The reward of the first and last steps, then each term: unweighted (its own scale, e.g. the share of correct
    answers) and, when its weight is not 1, what it added to the total."""
    if "reward_first" not in summary:
        return []
    lines = [
        f"  reward       {summary['reward_first']:.4f} (first 5 steps) -> {summary['reward_last']:.4f} (last 5 steps)"
        + (", the sum of each term x its weight:" if len(summary.get("terms", {})) > 1 else "")
    ]
    terms = summary.get("terms", {})
    width = max((len(name) for name in terms), default=0)
    for name, (first, last) in terms.items() if len(terms) > 1 else ():
        weight = weights.get(name)
        if not weight:  # unknown, or 0: what was logged is all there is
            lines.append(f"    {name:<{width}}  {first:.4f} -> {last:.4f}" + (" (weight 0)" if weight == 0 else ""))
            continue
        line = f"    {name:<{width}}  {first / weight:.4f} -> {last / weight:.4f} unweighted"
        if weight != 1:
            line += f", x {weight:g} = {first:.4f} -> {last:.4f} in the sum"
        lines.append(line)
    return lines


def summary_lines(
    summary: dict[str, Any],
    *,
    run_dir: str,
    adapter: str,
    overrides: list[str],
    serve: str,
    base_model: str,
    weights: dict[str, float] | None = None,
    repo_name: str = "my-adapter",
    verdict: str | None = None,
    curves: str | None = None,
) -> list[str]:
    """The end of a run, once: what it reached (per reward term), how fast, and commands that run as printed."""
    runtime = f" ({summary['runtime_s']:.0f} s of training)" if summary.get("runtime_s") else ""
    lines = [f"agrpo: done, {summary.get('steps', '-')} steps, final adapter in {adapter}{runtime}"]
    lines += reward_lines(summary, weights or {})
    speed = [f"{summary['steps_per_s']:.2f} steps/s"] if summary.get("steps_per_s") else []
    if summary.get("tokens_per_s"):
        speed.append(f"{summary['tokens_per_s']:.0f} trained tokens/s")
    if summary.get("stale_share") is not None:
        speed.append(f"{summary['stale_share']:.0%} of generated samples dropped as stale")
    if speed:
        lines.append("  speed        " + ", ".join(speed))
    if summary.get("samples", {}).get("used"):
        lines.append("  samples      " + accounting_line(summary["samples"]))
    requests = requests_line(summary.get("requests") or {})
    lines += [requests] if requests else []
    if verdict:
        lines.append(f"  bottleneck   {verdict}")
    if curves:
        lines.append(f"  curves       {curves}")
    q = shlex.quote
    lines += [
        "next:",
        "  evaluate     " + " ".join(["agrpo eval", *map(q, eval_overrides(overrides)), f"eval.adapter={q(adapter)}"]),
        f"  plot         agrpo plot {q(run_dir)}",
        f"  share        agrpo push {q(run_dir)} --repo-id {q(repo_name)} --dry-run   # the card; without --dry-run it uploads",
        f"  serve        {serve}",
        (
            f"  load (peft)  PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base_model!r}), "
            f"{adapter!r})"
        ),
    ]
    return lines


def serve_command(cfg: RunConfig, adapter: str, device: str) -> str:
    """The command that served this run's replicas (agrpo/inference/vllm_server.py), on port 8000, with the adapter
    loaded under the run's name: it works wherever the run's own replicas did."""
    from agrpo.inference.vllm_server import build_replica_launch

    launch = build_replica_launch(cfg, 8000, device, python="python")
    argv = [*launch.argv, "--lora-modules", f"{cfg.run_name}={adapter}"]
    if cfg.model.chat_template and (Path(adapter) / "chat_template.jinja").is_file():
        argv += ["--chat-template", str(Path(adapter) / "chat_template.jinja")]  # the template it was trained with
    env = [f"{key}={launch.env[key]}" for key in ("VLLM_CPU_KVCACHE_SPACE",) if key in launch.env]
    return " ".join([*env, shlex.join(argv)])


# ---- the callback -----------------------------------------------------------------------------------------------


class ConsoleCallback(TrainerCallback):
    """Banner at train begin, a progress bar, a compact line every `logger.console_every` steps; `print_summary`
    at the very end (after the final adapter is saved). Only the main process prints."""

    def __init__(
        self,
        cfg: RunConfig,
        num_replicas: int = 1,
        vllm_url: str | None = None,
        log_file: str | None = None,
        stream: TextIO | None = None,
        bar: bool | None = None,
        attention: str | None = None,
    ):
        self.cfg = cfg
        self.attention = attention  # the packed-attention choice (agrpo/trainer/seam/attention.py), for the banner
        self.num_replicas = num_replicas
        self.vllm_url = vllm_url
        self.log_file = log_file if log_file is not None else current_log_file()
        self.stream = stream if stream is not None else sys.stderr
        # None: a bar only on a terminal; redirected to a file (CI, Jobs logs) the compact lines say it all, where a
        # redrawn bar would be one endless line of carriage returns.
        self.want_bar = bar if bar is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = int(cfg.logger.console_every)
        self.every_s = float(cfg.logger.console_every_s)
        self.last_line_at = time.monotonic()
        self.events = ConsoleEvents()  # hung replicas, dropped groups: one line per kind of event
        self.history: list[dict[str, Any]] = []
        self.bar = None
        self.main = True
        self.log = logging.getLogger(CONSOLE_LOGGER)
        self.notices = RunNotices.for_config(cfg)  # no learning signal, episodes cut short: once each

    @property
    def run_dir(self) -> str:
        return str(self.cfg.sync.output_dir)

    def on_train_begin(self, args, state, control, **kwargs):
        self.main = state.is_world_process_zero
        if not self.main:
            return
        for line in banner_lines(
            run_dir=self.run_dir,
            model=str(self.cfg.model.name_or_path),
            lora_rank=int(self.cfg.lora.r),
            max_steps=int(state.max_steps),
            replicas=self.num_replicas,
            vllm_url=self.vllm_url,
            log_file=self.log_file,
            report_to=list(self.cfg.logger.report_to),
            attention=self.attention,
        ):
            self.log.info(line)
        self.log.debug("progress bar wanted: %s (stream %r)", self.want_bar, self.stream)
        if self.want_bar and self.cfg.logger.progress_bar and level_number(self.cfg.logger.level) <= logging.INFO:
            from tqdm import tqdm

            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,
                desc="train",
                unit="step",
                file=self.stream,
                dynamic_ncols=True,
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.main or not logs:
            return
        if "train_runtime" in logs:
            self.history.append({"train_runtime": logs["train_runtime"]})
            return
        if "perf/step_s" not in logs and "reward" not in logs:
            return
        self.history.append({**logs, "step": state.global_step})
        for level, line in self.events.observe(logs, state.global_step):
            self.log.log(level, line)
        for line in self.notices.observe(logs):
            self.log.info(line)
        if self.bar is not None and logs.get("reward") is not None:
            self.bar.set_postfix_str(f"reward {float(logs['reward']):.3f}", refresh=False)
        if self.every > 0 and line_due(
            state.global_step, self.every, time.monotonic() - self.last_line_at, self.every_s
        ):
            self.log.info(step_line(logs, state.global_step, int(state.max_steps)))
            self.last_line_at = time.monotonic()

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _curves(self) -> str | None:
        path = Path(self.run_dir) / CURVES_PNG
        return str(path) if path.is_file() else None

    def print_summary(
        self, final_adapter: str, verdict: str | None = None, samples: dict[str, Any] | None = None
    ) -> list[str]:
        """The end summary (call it after the final adapter is saved); returns the lines it printed. `samples`: the
        run's sample accounting as metrics.json has it, so both say the same: it reads the whole log history, whose
        last entry (TRL's train_runtime one) can carry the rollout child's last counts, which the steps seen here
        miss."""
        if not self.main:
            return []
        from agrpo.config.recipe_files import typed_overrides
        from agrpo.rewards.registry import term_weights

        figures = run_summary(self.history)
        if samples is not None:
            figures["samples"] = samples
        lines = summary_lines(
            figures,
            run_dir=self.run_dir,
            adapter=str(final_adapter),
            overrides=typed_overrides(self.run_dir),
            serve=serve_command(self.cfg, str(final_adapter), str(self.cfg.inference.device)),
            base_model=str(self.cfg.model.name_or_path),
            weights=term_weights(self.cfg.reward.funcs),
            repo_name=f"{self.cfg.run_name}-lora".replace("_", "-"),
            verdict=verdict,
            curves=self._curves(),
        )
        for line in lines:
            self.log.info(line)
        return lines
