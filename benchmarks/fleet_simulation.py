"""What `inference.replicas=auto` would do on the blog's topology: a trace-driven simulation of agrpo's own fleet
policy (agrpo/fleet/policy.py, the same `decide` / `took_effect` the controller calls), not a measurement.

The topology: a trainer Job on h200x2 and up to 8 replica Jobs on h200, each request ~5 s at the start. The trace:
completions grow longer as a reasoning policy learns, so a request's latency grows from `--latency-start` to
`--latency-end` seconds over the run (the blog's runs: ~5 s early). A replica serves `--concurrency` requests at once
(its KV cache bounds it for long completions), so it delivers concurrency / latency completions a second; a step
needs `--completions` of them and `--train-s` of the trainer's own compute, overlapped (max_staleness >= 1): a step
takes max(compute, generation) and the trainer waits for the difference. A replica Job takes `--boot-s` to serve
(scheduling, image, weights); a released one stops at once (it drains in seconds).

Printed: time to `--steps` steps, replica-seconds, $ (replicas at `--replica-usd-h`, the trainer at `--trainer-usd-h`
per hour), the trainer's idle share, for fixed-min, fixed-max and auto, plus auto's fleet over time.

    python benchmarks/fleet_simulation.py [--steps 500] [--max-replicas 8] [--latency-start 5 --latency-end 20]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from agrpo.fleet.policy import ADD, RELEASE, Knobs, Memory, Signals, decide, took_effect


@dataclass
class Run:
    replicas: int
    steps: int = 0
    now: float = 0.0
    replica_seconds: float = 0.0
    waited_s: float = 0.0
    window: list[tuple[float, float, float]] = field(default_factory=list)  # (step, wait, generation s) since a change
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas) at each change


def step_time(args, run: Run) -> tuple[float, float, float]:
    """(step seconds, of which the trainer waited, the replicas' generation seconds) at the run's progress."""
    progress = run.steps / args.steps
    latency = args.latency_start + (args.latency_end - args.latency_start) * progress
    generation = args.completions / (run.replicas * args.concurrency / latency)
    step = max(args.train_s, generation)
    return step, step - args.train_s, generation


def signals(run: Run, changing: bool, recent_steps: int) -> Signals:
    """The window's signals as the controller measures them (its latest `recent_steps` steps); the replicas' busy
    share is their utilisation here (generation time / step time), what the controller's per-poll samples of vLLM's
    queue and KV use average to."""
    window = run.window[-recent_steps:]
    total = sum(step for step, _, _ in window)
    return Signals(
        now=run.now,
        replicas=run.replicas,
        steps=len(window),
        steps_per_s=len(window) / total if total else None,
        wait_share=sum(wait for _, wait, _ in window) / total if total else None,
        stale_share=0.0,
        busy_share=min(1.0, sum(gen for _, _, gen in window) / total) if total else None,
        changing=changing,
    )


def simulate(args, fewest: int, most: int, auto: bool) -> Run:
    knobs = Knobs(
        min_replicas=fewest,
        max_replicas=most,
        window_steps=5,
        recent_steps=args.recent_steps,
        cooldown_s=60.0,
        add_wait_share=args.add_wait_share,
    )
    run, memory, pending = Run(replicas=fewest), Memory(), None  # pending: (decision, basis, ready at)
    run.history.append((0.0, fewest))
    while run.steps < args.steps:
        step, wait, generation = step_time(args, run)
        run.now += step
        run.steps += 1
        run.waited_s += wait
        run.replica_seconds += step * (run.replicas + (1 if pending and pending[0].action == ADD else 0))
        run.window.append((step, wait, generation))
        if not auto:
            continue
        if pending is not None and run.now >= pending[2]:
            decision, basis, _ = pending
            run.replicas += 1 if decision.action == ADD else -1
            memory, pending, run.window = took_effect(decision, basis, run.now, memory), None, []
            run.history.append((run.now, run.replicas))
            continue
        decision, memory = decide(signals(run, pending is not None, knobs.recent_steps), memory, knobs)
        if decision.action in (ADD, RELEASE) and pending is None:
            pending = (
                decision,
                signals(run, False, knobs.recent_steps),
                run.now + (args.boot_s if decision.action == ADD else 0.0),
            )
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--completions", type=int, default=128, help="completions a step trains (16 prompts x 8)")
    parser.add_argument("--train-s", type=float, default=30.0, help="the trainer's own compute per step")
    parser.add_argument("--concurrency", type=int, default=16, help="requests one replica serves at once")
    parser.add_argument("--latency-start", type=float, default=5.0)
    parser.add_argument("--latency-end", type=float, default=20.0)
    parser.add_argument("--boot-s", type=float, default=180.0, help="a replica Job's time to serve")
    parser.add_argument("--add-wait-share", type=float, default=Knobs.add_wait_share, help="the policy's knob")
    parser.add_argument("--recent-steps", type=int, default=Knobs.recent_steps, help="the policy's knob")
    parser.add_argument("--replica-usd-h", type=float, default=5.0)
    parser.add_argument("--trainer-usd-h", type=float, default=10.0)
    args = parser.parse_args()
    lo, hi = args.min_replicas, args.max_replicas
    runs = {f"fixed {lo}": simulate(args, lo, lo, False), f"fixed {hi}": simulate(args, hi, hi, False)}
    runs[f"auto {lo}..{hi}"] = simulate(args, lo, hi, True)
    print(
        f"simulated: {args.steps} steps, latency {args.latency_start:g} -> {args.latency_end:g} s, {args.boot_s:g} s boot"
    )
    print("| fleet | time (h) | replica-hours | $ | trainer idle |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        usd = run.replica_seconds / 3600 * args.replica_usd_h + run.now / 3600 * args.trainer_usd_h
        row = f"| {name} | {run.now / 3600:.2f} | {run.replica_seconds / 3600:.1f} | {usd:.0f} |"
        print(f"{row} {run.waited_s / run.now:.0%} |")
    auto = runs[f"auto {lo}..{hi}"]
    print("auto's fleet (h: replicas): " + ", ".join(f"{t / 3600:.2f}: {n}" for t, n in auto.history))


if __name__ == "__main__":
    main()
