"""After a Jobs run, on the launching machine: what to do next, as commands that work there (pure, but for
`launch_context`, which reads Hydra's run of this process).

The run's folder lives in the bucket, so every path a Job printed (`/bucket/RUN_ID/...`) means nothing here. The end
of a Jobs run therefore prints `agrpo pull` first, then eval, plot, push and vLLM on the pulled copy under
outputs/<run_name>/<RUN_ID>, and `agrpo jobs status` for the spend. The dry run also suggests CPU flavors when the
model is one agrpo builds (small enough for CPU), with what they would cost.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from agrpo.config.schema import RunConfig
from agrpo.launchers.hf_jobs.cost import PRICE_PER_HOUR_USD
from agrpo.launchers.hf_jobs.plan import AfterRun, LaunchRecord, LocalInput

DEFAULT_BUCKET = "agrpo-runs"  # as SyncConfig.bucket: `agrpo pull` needs no --bucket for it
CPU_FLAVOR = "cpu-upgrade"  # the CPU flavor suggested for models agrpo builds (tiny, SmolLM2-135M)
LAUNCH_LOG = "logs/launch.log"


def launch_context() -> tuple[str | None, list[str] | None]:
    """(this process's Hydra run dir, the overrides it was launched with), or (None, None) outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None, None
    hydra = HydraConfig.get()
    return str(hydra.runtime.output_dir), [str(o) for o in hydra.overrides.task]


def eval_overrides(overrides: list[str]) -> list[str]:
    """The overrides that say what was trained (as agrpo/trainer/console/callback.py keeps them for a local run's
    summary)."""
    keep = ("+recipe=", "recipe=", "model", "+model", "lora", "+lora", "data", "+data", "reward", "+reward")
    return [o for o in overrides if o.startswith(keep)]


def samples_per_step(cfg: RunConfig) -> int | None:
    """Samples per optimizer step when the config fixes it (no token budget), for $ per 1,000 samples."""
    trainer, jobs = cfg.trainer, cfg.launcher.hf_jobs
    if trainer.token_budget:
        return None
    processes = 1
    if jobs.trainer_launcher == "accelerate":  # one rank per GPU of the flavor (h200x2: 2) unless set
        gpus = re.search(r"x(\d+)$", str(jobs.trainer_flavor))
        processes = cfg.launcher.accelerate.num_processes or (int(gpus[1]) if gpus else 1)
    return int(trainer.per_device_train_batch_size) * int(trainer.gradient_accumulation_steps) * int(processes)


def after_run(
    cfg: RunConfig, run_id: str, inputs: list[LocalInput], local_dir: str | None, overrides: list[str] | None
) -> AfterRun:
    model = next((i.source for i in inputs if i.key == "model.name_or_path"), str(cfg.model.name_or_path))
    return AfterRun(
        run_name=str(cfg.run_name),
        pull_dir=f"outputs/{cfg.run_name}/{run_id}",
        bucket_name=str(cfg.sync.bucket).split("/")[-1],
        eval_overrides=eval_overrides(overrides or []),
        base_model=model,
        served_rank=int(cfg.inference.max_lora_rank),
        samples_per_step=samples_per_step(cfg),
        launch_log=str(Path(local_dir) / LAUNCH_LOG) if local_dir else None,
    )


def launch_record(run_dir_in_bucket: str, overrides: list[str] | None) -> LaunchRecord | None:
    if overrides is None:
        return None
    import yaml

    return LaunchRecord(f"{run_dir_in_bucket}/.hydra/overrides.yaml", yaml.safe_dump(list(overrides)))


def cpu_flavor_note(cfg: RunConfig, flavors: list[str]) -> str | None:
    """A model agrpo builds (model.builder: tiny, SmolLM2-135M) trains on CPU: say what CPU flavors would cost."""
    if not cfg.model.builder or all(f.startswith("cpu-") for f in flavors):
        return None
    now = sum(PRICE_PER_HOUR_USD.get(f, 0.0) for f in flavors)
    cpu = PRICE_PER_HOUR_USD[CPU_FLAVOR] * len(flavors)
    return (
        f"this run's model is built by agrpo ({cfg.model.builder}), small enough for CPU: on CPU flavors it would "
        f"cost ~${cpu:.2f}/hour instead of ~${now:.2f}/hour: launcher.hf_jobs.replica_flavor={CPU_FLAVOR} "
        f"launcher.hf_jobs.trainer_flavor={CPU_FLAVOR} inference.device=cpu and launcher.hf_jobs.replica_image=<a CPU "
        "build of vLLM>"
    )


def pull_command(after: AfterRun, run_id: str, namespace: str, replay: list[str]) -> str:
    """`agrpo pull` as it finds this run again: by id in the namespace (or the bucket path), or on a stand-in Hub."""
    source = run_id if after.bucket_name == DEFAULT_BUCKET else f"{namespace}/{after.bucket_name}/{run_id}"
    where = ["--namespace", namespace] if source == run_id and not replay else []
    return shlex.join(["agrpo", "pull", source, *where, *replay])


def next_commands(after: AfterRun, run_id: str, namespace: str, replay: list[str]) -> list[str]:
    """The commands the end of a Jobs run prints, each working on this machine once the run is pulled. `replay`:
    how `agrpo pull`/`agrpo jobs` reach this run's Hub again ([] for the Hub; a stand-in's own flags, hub.py)."""
    q = shlex.quote
    run_dir, adapter = after.pull_dir, f"{after.pull_dir}/final_adapter"
    rank = max(16, after.served_rank)  # vLLM's default is 16
    status = ["agrpo", "jobs", "status", run_id, *(["--namespace", namespace] if not replay else []), *replay]
    return [
        "next (on this machine):",
        f"  pull         {pull_command(after, run_id, namespace, replay)}   (into {run_dir})",
        "  evaluate     " + " ".join(["agrpo eval", *map(q, after.eval_overrides), f"eval.adapter={q(adapter)}"]),
        f"  plot         agrpo plot {q(run_dir)}",
        f"  share        agrpo push {q(run_dir)} --repo-id NAME [--private]",
        (
            f"  serve        vllm serve {q(after.base_model)} --enable-lora --max-lora-rank {rank} "
            f"--lora-modules {q(after.run_name)}={q(adapter)}"
        ),
        f"  spend        {shlex.join(status)}",
    ]
