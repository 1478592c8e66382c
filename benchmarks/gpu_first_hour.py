"""`make gpu-check`: the one command for the first GPU machine (issue 45, item 7). UNTESTED ON A GPU: no device was
lent to the session that wrote it; its plan and table are tested on simulated machines (tests/test_gpu_first_hour.py).

On a machine set up with `make setup-gpu`, it runs, one after another, each a real `python -m agrpo` run:
  demo        the smoke recipe (what `make demo` runs)
  gsm8k       20 steps of the gsm8k recipe; where agrpo's GPU planner refuses it as shipped (cards under 80 GB),
              with the first settings its refusal offers
  fa3 / sdpa  10 gsm8k steps each with trainer.attention=fa3 and =sdpa (FA3 only where agrpo's choice allows it)
  2 replicas  10 gsm8k steps with two replicas: on one GPU, sharing it with the trainer (inference.gpus=[0,0]) if
              the planner accepts it (with its advice if need be); on 3+ GPUs, each on its own
while a thread samples every GPU's used memory (nvidia-smi). It writes <out>/gpu_check.json and <out>/table.md,
steps/s and the memory peak against the planner's estimate for each run, the table docs/gpu.md wants
(`--doc docs/gpu.md` puts it there, between its gpu-check markers).

    python benchmarks/gpu_first_hour.py [--out gpu_check_out] [--doc docs/gpu.md]
    python benchmarks/gpu_first_hour.py --dry-run [--simulate 1x80]     # the steps, on any machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agrpo.config.gpu_advice import Machine, verdict  # noqa: E402
from agrpo.config.gpu_plan import needs_of, place, gpu_use  # noqa: E402
from agrpo.config.memory_estimate import GIB  # noqa: E402

MIB = 1024**2
BEGIN, END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"


@dataclass
class Step:
    name: str
    overrides: list[str]
    note: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, python: str, run_dir: Path) -> list[str]:
        return [python, "-m", "agrpo", *self.overrides, "trainer.save_steps=0", f"hydra.run.dir={run_dir}"]


def simulated(spec: str) -> Machine:
    """`1x80` -> one 80 GB H100-like GPU (its memory as nvidia-smi reports it)."""
    from agrpo.config.gpu_cards import CARDS

    count, size = spec.lower().split("x")
    memory = dict(CARDS)[f"{size} GB"]
    return Machine(int(count), memory, f"simulated {size} GB GPU")


def fitted(base: list[str], machine: Machine, model_config: dict | None) -> tuple[list[str], str]:
    """`base` as is when the planner accepts it on `machine`, else with the first settings its refusal offers."""
    from agrpo.config.compose import compose_run_config

    found = verdict(compose_run_config(base, output_dir="/tmp/agrpo-gpu-check"), machine, model_config)
    if not found.problems:
        return base, ""
    if not found.advice:
        return [], "refused, no settings fit: " + "; ".join(found.problems)
    return [*base, *found.advice[0]], "with the planner's advice: " + " ".join(found.advice[0])


def plan(machine: Machine, model_config: dict | None, data_path: str | None) -> list[Step]:
    """The steps for this machine (pure but for composing the configs)."""
    data = [f"data.path={data_path}"] if data_path else []
    gsm8k = ["+recipe=gsm8k", *data]
    steps = [Step("demo", ["+recipe=smoke"], env={"HF_HUB_OFFLINE": "1"})]
    shipped, note = fitted([*gsm8k, "trainer.max_steps=20"], machine, model_config)
    steps.append(Step("gsm8k", shipped, note))
    base = [o for o in shipped if not o.startswith("trainer.max_steps=")]
    for attention, note in (("fa3", "refused where FA3 cannot run (the log says why)"), ("sdpa", "")):
        steps.append(Step(attention, [*base, "trainer.max_steps=10", f"trainer.attention={attention}"], note))
    two = [*gsm8k, "trainer.max_steps=10", "inference.replicas=2"]
    if machine.count == 1:
        two += ["inference.gpus=[0,0]", "trainer.gpus=[0]"]
    overrides, note = fitted(two, machine, model_config)
    steps.append(Step("2 replicas", overrides, note))
    return [step for step in steps if step.overrides]


class MemorySampler(threading.Thread):
    """The most memory each GPU held while a step ran (nvidia-smi's memory.used, every `period_s`)."""

    def __init__(self, period_s: float = 0.5):
        super().__init__(daemon=True)
        self.period_s, self.peak_mib, self.done = period_s, {}, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            for line in out.strip().splitlines():
                index, used = (int(part) for part in line.split(","))
                self.peak_mib[index] = max(self.peak_mib.get(index, 0), used)


def planned_gib(overrides: list[str], machine: Machine, model_config: dict | None) -> dict[int, float]:
    """Per GPU, what the planner puts on it (replica fractions, their outside memory, the trainer's estimate)."""
    from agrpo.config.compose import compose_run_config

    if not any(o.startswith("+recipe=gsm8k") for o in overrides):
        return {}
    cfg = compose_run_config(overrides, output_dir="/tmp/agrpo-gpu-check")
    placement = place(cfg, machine.count)
    if isinstance(placement, str):
        return {}
    trainer = needs_of(cfg, model_config, machine.bf16).trainer
    gpus = {g for gpus in placement.replicas for g in gpus} | set(placement.trainer)
    return {gpu: gpu_use(placement, gpu, machine.memory, trainer) / GIB for gpu in sorted(gpus)}


def figures(run_dir: Path, log: str) -> dict:
    """steps/s after two warm-up steps (TRL's perf/step_s), the attention the banner names, the last reward."""
    history_path = run_dir / "log_history.json"
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
    times = [entry["perf/step_s"] for entry in history if "perf/step_s" in entry][2:]
    attention = next(
        (line.split("attention", 1)[1].strip() for line in log.splitlines() if "attention    " in line), ""
    )
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    return {
        "steps_per_s": round(1 / statistics.fmean(times), 3) if times else None,
        "attention": attention[:80],
        "reward_last": metrics.get("reward_last"),
    }


def run_step(step: Step, python: str, out: Path) -> dict:
    run_dir = (out / step.name.replace(" ", "_")).resolve()
    sampler = MemorySampler()
    sampler.start()
    started = time.monotonic()
    done = subprocess.run(
        step.argv(python, run_dir), cwd=REPO, env={**os.environ, **step.env}, capture_output=True, text=True
    )
    sampler.done.set()
    sampler.join()
    (out / f"{step.name.replace(' ', '_')}.log").write_text(done.stdout + done.stderr)
    result = {"step": step.name, "ok": done.returncode == 0, "wall_s": round(time.monotonic() - started, 1)}
    result.update(figures(run_dir, done.stdout + done.stderr))
    result["peak_gib"] = {gpu: round(mib * MIB / GIB, 1) for gpu, mib in sorted(sampler.peak_mib.items())}
    return result


def table(machine: Machine, rows: list[dict]) -> str:
    """The markdown table docs/gpu.md holds (pure)."""
    lines = [
        f"`make gpu-check` on {machine.count} x {machine.name} ({machine.memory / GIB:.1f} GiB each):",
        "",
        "| run | ok | wall s | steps/s | attention | peak GiB per GPU (nvidia-smi) | planned GiB (estimate) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        peak = ", ".join(f"{gpu}: {gib}" for gpu, gib in row.get("peak_gib", {}).items()) or "-"
        planned = ", ".join(f"{gpu}: {gib:.1f}" for gpu, gib in row.get("planned_gib", {}).items()) or "-"
        lines.append(
            f"| {row['step']} | {'yes' if row.get('ok') else 'NO'} | {row.get('wall_s', '-')} | "
            f"{row.get('steps_per_s') or '-'} | {row.get('attention') or '-'} | {peak} | {planned} | "
            f"{row.get('note', '')} |"
        )
    return "\n".join(lines) + "\n"


def into_doc(doc: Path, text: str) -> None:
    """Put `text` between the doc's gpu-check markers."""
    content = doc.read_text()
    head, _, rest = content.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def local_machine() -> Machine:
    from agrpo.config.gpu_precision import local_facts

    facts = local_facts()
    if not facts.cuda:
        raise SystemExit("make gpu-check needs a CUDA GPU torch can see (set up with make setup-gpu)")
    return Machine(facts.count, facts.memory_bytes, facts.name, facts.bf16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check_out", type=Path)
    parser.add_argument("--doc", type=Path, help="put the table into this doc, between its gpu-check markers")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    parser.add_argument(
        "--simulate", help="with --dry-run: plan for NxGB GPUs (e.g. 1x80, 2x48) instead of this machine"
    )
    args = parser.parse_args(argv)
    from agrpo.config.model_config_fetch import model_config_for_check

    machine = simulated(args.simulate) if args.simulate else local_machine()
    model_config, why = model_config_for_check("Qwen/Qwen2.5-0.5B-Instruct")
    data = Path(os.environ.get("AGRPO_DATA_DIR", REPO.parent / "shared" / "data")) / "gsm8k" / "train.jsonl"
    steps = plan(machine, model_config, str(data) if data.is_file() else None)
    if why:
        print(f"(no memory estimate: {why})")
    if args.dry_run:
        for step in steps:
            print(f"{step.name}: {' '.join(step.argv('python', args.out / step.name.replace(' ', '_')))}"
                  + (f"   # {step.note}" if step.note else ""))  # fmt: skip
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in steps:
        print(f"gpu-check: {step.name} ...", flush=True)
        row = run_step(step, sys.executable, args.out)
        rows.append({**row, "note": step.note, "planned_gib": planned_gib(step.overrides, machine, model_config)})
    (args.out / "gpu_check.json").write_text(json.dumps(rows, indent=2))
    text = table(machine, rows)
    (args.out / "table.md").write_text(text)
    print(text)
    if args.doc:
        into_doc(args.doc, text)
    return 0 if all(row["ok"] for row in rows if row["step"] != "fa3") else 1  # fa3 may be refused: it says why


if __name__ == "__main__":
    sys.exit(main())
