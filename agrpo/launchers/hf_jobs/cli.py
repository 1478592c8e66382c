"""`agrpo jobs status|logs|cancel RUN_ID`: find a run's Jobs by their agrpo-run label, wherever it was launched.

Useful after `launcher.hf_jobs.detach=true`, a closed laptop, or to stop a run for good: `cancel` stops every Job
of the run that is not over yet. `status` also says what the run has cost so far: each Job's running time x its
flavor's price (the Jobs API's hardware list, or agrpo's table when it cannot be read, marked as such). After a
rehearsal (`--rehearse`), `--rehearsal-dir DIR` asks its stand-in Hub, replayed from its folder (hub.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from huggingface_hub.errors import HfHubHTTPError

from agrpo.errors import AgrpoError
from agrpo.launchers.hf_jobs.client import TERMINAL_STAGES, cancel_jobs, resolve_namespace, run_jobs, stage_of
from agrpo.launchers.hf_jobs.cost import Prices, duration, job_costs, read_prices, total_usd
from agrpo.launchers.hf_jobs.hub import add_replay_flag, finished_run_hub
from agrpo.launchers.hf_jobs.plan import ROLE_LABEL


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agrpo jobs", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("status", "list the run's Jobs with their stage, flavor and URL"),
        ("logs", "print a Job's logs (the trainer's by default)"),
        ("cancel", "cancel every Job of the run that is not over yet"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("run_id", help="launcher.hf_jobs.run_id of the run")
        sub.add_argument("--namespace", help="user or org the Jobs run in (default: the token's user)")
        add_replay_flag(sub)
        if name == "logs":
            sub.add_argument("--role", default="trainer", help="trainer, replica, or a Job name (e.g. RUN-vllm-1)")
            sub.add_argument("--follow", "-f", action="store_true", help="keep streaming until the Job ends")
            sub.add_argument("--tail", type=int, help="only the last N lines")
    return parser.parse_args(argv)


def status_rows(jobs: list, prices: Prices) -> list[str]:
    """One row per Job (id, role, stage, flavor, name, running time, cost), then the spend so far."""
    costs = job_costs(jobs, prices)
    rows = [f"{'JOB ID':<26} {'ROLE':<8} {'STAGE':<10} {'FLAVOR':<10} {'NAME':<24} {'RUNNING':>8} {'COST':>9}  URL"]
    for job, cost in zip(jobs, costs):
        labels = job.labels or {}
        usd = "?" if cost.usd is None else f"${cost.usd:.2f}"
        rows.append(
            f"{job.id:<26} {labels.get(ROLE_LABEL, '?'):<8} {stage_of(job):<10} {str(job.flavor):<10} "
            f"{labels.get('name', ''):<24} {duration(cost.running_s):>8} {usd:>9}  {job.url}"
        )
    running = sum(stage_of(job) not in TERMINAL_STAGES for job in jobs)
    still = f", {running} Job(s) still running" if running else ""
    rows.append(f"spend so far: ${total_usd(costs):.2f}{still} (prices: {prices.source})")
    return rows


def pick_job(jobs: list, role: str):
    """The newest Job of `role` (trainer/replica) or the Job named `role`."""
    matching = [j for j in jobs if (j.labels or {}).get(ROLE_LABEL) == role or (j.labels or {}).get("name") == role]
    return matching[-1] if matching else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        with finished_run_hub(args.replay_dir) as (api, replayed):
            return run_command(args, api, resolve_namespace(api, args.namespace or replayed))
    except AgrpoError as error:
        print(f"agrpo jobs: error: {error}", file=sys.stderr)
        return error.exit_code
    except HfHubHTTPError as error:  # e.g. a token without access to the namespace
        print(f"agrpo jobs: the Hub refused: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1


def run_command(args: argparse.Namespace, api: Any, namespace: str) -> int:
    """status, cancel or logs of the run's Jobs in `namespace`."""
    jobs = run_jobs(api, namespace, args.run_id)
    if not jobs:
        print(f"agrpo jobs: no Job labelled agrpo-run={args.run_id} in {namespace}", file=sys.stderr)
        return 1
    if args.command == "status":
        print("\n".join(status_rows(jobs, read_prices(api))))
    elif args.command == "cancel":
        cancelled = cancel_jobs(api, namespace, [job.id for job in jobs])
        print(
            f"agrpo jobs: cancelled {len(cancelled)} Job(s) of run {args.run_id}"
            + (f": {' '.join(cancelled)}" if cancelled else " (all were already over)")
        )
    else:
        job = pick_job(jobs, args.role)
        if job is None:
            print(f"agrpo jobs: run {args.run_id} has no Job {args.role!r}", file=sys.stderr)
            return 1
        for line in api.fetch_job_logs(job_id=job.id, namespace=namespace, follow=args.follow, tail=args.tail):
            print(line)
    return 0
