"""`benchmarks/shared_fleet.py --mode kill`: run B's steps/s alone on a shared fleet against B's after run A, sharing the
fleet with it, was SIGKILLed mid-run (issue 43: "run B completes with steps/s within noise of running alone").

One sitting, one fleet (`agrpo fleet up NAME +recipe=R`): B alone; then A (a long run) and B at once, A's trainer
SIGKILLed once B reached --kill-at steps (its launcher lives and unregisters it, as in tests/e2e/test_shared_fleet.py);
then B alone again (the noise of "alone" itself). Steps/s come from B's own `fleet/steps.jsonl` (each line's wall time
`t` and `step`): alone from its step 5 on; with A from step 5 to the kill; after the kill from --settle-s after it to
the end. Prints one line per run and a table; asserts nothing (docs/shared_fleet.md, "B alone and after A is killed").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FIRST_STEP = 5  # the first steps warm up (the first adapter load, the prefix cache): left out of every rate


# ---- pure ---------------------------------------------------------------------------------------------------------


def steps_of(text: str) -> list[dict]:
    """The step entries of a steps.jsonl text that carry a wall time and a step (others skipped)."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("t"), (int, float)) and isinstance(entry.get("step"), int):
            entries.append(entry)
    return entries


def rate(entries: list[dict], t_from: float = float("-inf"), t_to: float = float("inf")) -> float | None:
    """Steps per second between the first and the last entry within [t_from, t_to] at or after FIRST_STEP (None with
    fewer than two)."""
    kept = [e for e in entries if t_from <= e["t"] <= t_to and e["step"] >= FIRST_STEP]
    if len(kept) < 2 or kept[-1]["t"] <= kept[0]["t"]:
        return None
    return (kept[-1]["step"] - kept[0]["step"]) / (kept[-1]["t"] - kept[0]["t"])


def table(rows: list[dict]) -> list[str]:
    """Markdown: each figure of each sitting, and B after the kill over B alone (the mean of its two alone runs)."""
    lines = ["| sitting | B alone (before) | B with A | B after A's SIGKILL | B alone (after) | after / alone |"]
    lines.append("|---|---|---|---|---|---|")
    for index, row in enumerate(rows, 1):
        alone = [v for v in (row["alone_before"], row["alone_after"]) if v is not None]
        ratio = f"{row['after_kill'] / (sum(alone) / len(alone)):.2f}x" if alone and row["after_kill"] else "-"
        cells = [f"{row[k]:.2f}" if row[k] is not None else "-" for k in
                 ("alone_before", "with_a", "after_kill", "alone_after")]  # fmt: skip
        lines.append(f"| {index} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


# ---- runs ---------------------------------------------------------------------------------------------------------


def agrpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "agrpo", *args]


def trainer_pids(config_path: Path) -> list[int]:
    """The trainer processes of the run whose config.yaml is `config_path` (`python -m agrpo.trainer <config>`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if entry.isdigit() else []
        except OSError:
            continue
        if b"agrpo.trainer" in argv and str(config_path).encode() in argv:
            found.append(int(entry))
    return found


def start_fleet(name: str, recipe: str, base: Path, extra: list[str]) -> subprocess.Popen:
    log = open(base / "fleet.log", "w")
    fleet = subprocess.Popen(
        agrpo("fleet", "up", name, f"+recipe={recipe}", *extra), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}, cwd=base,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while f"fleet {name} ready at" not in (base / "fleet.log").read_text():
        if fleet.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"fleet {name} did not start; see {base / 'fleet.log'}")
        time.sleep(0.5)
    return fleet


def attached(name: str, args, run_dir: Path, steps: int, out: Path) -> subprocess.Popen:
    argv = agrpo(
        f"+recipe={args.recipe}", f"inference.shared_fleet={name}", f"trainer.max_steps={steps}",
        f"run_name={run_dir.name}", f"hydra.run.dir={run_dir}", *args.extra,
    )  # fmt: skip
    return subprocess.Popen(
        argv, stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=run_dir.parent,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


def steps_file(run_dir: Path) -> list[dict]:
    path = run_dir / "fleet" / "steps.jsonl"
    return steps_of(path.read_text(errors="replace")) if path.is_file() else []


def alone(name: str, args, base: Path, label: str) -> float | None:
    run_dir = base / f"b-{label}"
    code = attached(name, args, run_dir, args.steps, base / f"b-{label}.out").wait()
    if code != 0:
        raise SystemExit(f"run B ({label}) failed (exit {code}); see {base / f'b-{label}.out'}")
    return rate(steps_file(run_dir))


def with_a_killed(name: str, args, base: Path) -> tuple[float | None, float | None, float]:
    """(B's steps/s with A, B's steps/s after A's trainer was SIGKILLed, seconds from the kill to A's adapters'
    unregistration as A's launcher saw it: its exit)."""
    a_dir, b_dir = base / "a", base / "b-with-a"
    a = attached(name, args, a_dir, 10 * args.steps, base / "a.out")
    b = attached(name, args, b_dir, args.steps, base / "b-with-a.out")
    deadline = time.monotonic() + 600
    while not (steps_file(b_dir) and steps_file(b_dir)[-1]["step"] >= args.kill_at and steps_file(a_dir)):
        if b.poll() is not None or a.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"A or B ended before the kill; see {base}/a.out, b-with-a.out")
        time.sleep(0.2)
    pids = trainer_pids(a_dir / "config.yaml")
    killed_at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    a.wait(timeout=120)
    a_gone = time.time() - killed_at
    if b.wait() != 0:
        raise SystemExit(f"run B failed after A was killed; see {base / 'b-with-a.out'}")
    entries = steps_file(b_dir)
    return rate(entries, t_to=killed_at), rate(entries, t_from=killed_at + args.settle_s), a_gone


def main(args) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="shared-fleet-kill-"))
    rows = []
    for sitting in range(args.repeats):
        here = base / str(sitting)
        here.mkdir()
        name = f"kill-{os.getpid()}-{sitting}"
        fleet = start_fleet(name, args.recipe, here, args.extra)
        try:
            before = alone(name, args, here, "alone-before")
            with_a, after, a_gone = with_a_killed(name, args, here)
            after_alone = alone(name, args, here, "alone-after")
        finally:
            os.killpg(fleet.pid, signal.SIGTERM)
            fleet.wait(timeout=90)
        row = {"alone_before": before, "with_a": with_a, "after_kill": after, "alone_after": after_alone}
        rows.append({**row, "a_launcher_exit_s": a_gone})
        print(f"sitting {sitting + 1}: " + ", ".join(f"{k} {v:.2f}" if v else f"{k} -" for k, v in rows[-1].items()))
    (base / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"\n+recipe={args.recipe} trainer.max_steps={args.steps} (A: {10 * args.steps}), A's trainer SIGKILLed at B's "
          f"step {args.kill_at}; steps/s of B from its fleet/steps.jsonl (from step {FIRST_STEP}; after the kill from "
          f"{args.settle_s:g} s after it)")  # fmt: skip
    print("\n".join(table(rows)))
    print(f"(runs and results.json in {base})")
