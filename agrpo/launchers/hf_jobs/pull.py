"""`agrpo pull RUN_ID`: download a Jobs run's folder from its bucket into outputs/<run_name>/<RUN_ID>.

The final adapter, metrics, curves, TensorBoard, the run config, the launch command and the logs; checkpoints only
with --checkpoints; never the adapters published for the replicas (.vllm_lora/), the wheel (.agrpo/) or the inputs
uploaded from the launching machine (inputs/). Resumable: a file already here at the size the bucket lists is kept,
and each file lands under its name only once its size matches (a cut download leaves a .part file, fetched again
next time). `agrpo eval`, `plot` and `push` then work on the folder as on a local run's.

RUN_ID is looked up in <namespace>/agrpo-runs (--namespace: a user or org, default the token's user; --bucket for
another bucket), or give the bucket path: `hf://buckets/NS/BUCKET/RUN_ID` or `NS/BUCKET/RUN_ID`. After a rehearsal
(`--rehearse`), `--rehearsal-dir DIR` reads its stand-in's bucket folder through the same API.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agrpo.errors import AgrpoError, LaunchError
from agrpo.launchers.hf_jobs.hub import add_replay_flag, finished_run_hub

NEVER = (".vllm_lora/", ".agrpo/", "inputs/")  # replicas' adapters, the wheel, the launching machine's own inputs
PART = ".part"


@dataclass
class Source:
    bucket: str  # namespace/name
    run_id: str


@dataclass
class Remote:
    path: str  # relative to the run's folder
    size: int
    entry: Any  # huggingface_hub's BucketFile, handed back to download_bucket_files


def parse_source(spec: str, namespace: str | None, bucket: str) -> tuple[str | None, str, str]:
    """(namespace or None, bucket name, run id) from RUN_ID or a bucket path."""
    path = spec.removeprefix("hf://buckets/").strip("/")
    parts = path.split("/")
    if len(parts) == 1:
        return namespace, bucket, parts[0]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise LaunchError(f"{spec!r} is neither a run id nor a bucket path (hf://buckets/NAMESPACE/BUCKET/RUN_ID)")


def wanted(path: str, checkpoints: bool) -> bool:
    if path.startswith(NEVER) or path.endswith(PART):
        return False
    return checkpoints or not path.split("/", 1)[0].startswith("checkpoint-")


def select(remote: list[Remote], checkpoints: bool) -> tuple[list[Remote], list[Remote]]:
    """(files to pull, checkpoint files left out)."""
    kept = [r for r in remote if wanted(r.path, checkpoints)]
    left_out = [r for r in remote if not checkpoints and wanted(r.path, True) and not wanted(r.path, False)]
    return kept, left_out


def missing(files: list[Remote], dest: Path) -> list[Remote]:
    """Files not here yet at the size the bucket lists (the rest is kept: a pull resumes)."""
    todo = []
    for remote in files:
        here = dest / remote.path
        if not (here.is_file() and here.stat().st_size == remote.size):
            todo.append(remote)
    return todo


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def list_run(api: Any, source: Source) -> list[Remote]:
    prefix = source.run_id + "/"
    try:
        listed = list(api.list_bucket_tree(source.bucket, prefix=source.run_id, recursive=True))
    except Exception as error:
        raise LaunchError(
            f"cannot list bucket {source.bucket} ({type(error).__name__}: {str(error).strip().splitlines()[-1]}): "
            "check the namespace (--namespace), the bucket (--bucket) and the token's read access"
        ) from None
    found = [
        Remote(e.path[len(prefix) :], int(e.size), e)
        for e in listed
        if getattr(e, "size", None) is not None and e.path.startswith(prefix)
    ]
    if not found:
        raise LaunchError(f"bucket {source.bucket} holds no run {source.run_id!r} (nothing under {prefix})")
    return found


def fetch(api: Any, source: Source, remote: Remote, dest: Path) -> None:
    """One file, through a .part name, renamed once its size is the listed one."""
    target = dest / remote.path
    part = target.with_name(target.name + PART)
    target.parent.mkdir(parents=True, exist_ok=True)
    api.download_bucket_files(source.bucket, [(remote.entry, str(part))], raise_on_missing_files=True)
    size = part.stat().st_size if part.is_file() else None
    if size != remote.size:
        raise LaunchError(
            f"{remote.path}: got {size} bytes where the bucket lists {remote.size}; run the same `agrpo pull` "
            "again to fetch what is missing"
        )
    os.replace(part, target)


def default_dest(api: Any, source: Source, files: list[Remote]) -> tuple[Path, Remote | None]:
    """outputs/<run_name>/<RUN_ID>, run_name read from the run's config.yaml (fetched first, then kept there)."""
    import shutil
    import tempfile

    from omegaconf import OmegaConf

    config = next((r for r in files if r.path == "config.yaml"), None)
    if config is None:
        return Path("outputs") / "jobs" / source.run_id, None
    dest_config = None
    with tempfile.TemporaryDirectory(prefix="agrpo-pull-") as scratch:
        fetch(api, source, config, Path(scratch))
        dest = Path("outputs") / str(OmegaConf.load(Path(scratch) / "config.yaml").get("run_name") or "jobs")
        dest = dest / source.run_id
        dest.mkdir(parents=True, exist_ok=True)
        if missing([config], dest):
            shutil.move(str(Path(scratch) / "config.yaml"), dest / "config.yaml")
            dest_config = config
    return dest, dest_config


def pull(api: Any, source: Source, to: str | None, checkpoints: bool, out=sys.stderr) -> tuple[Path, dict[str, int]]:
    """Download the run's folder; returns (where, counts)."""
    from tqdm import tqdm

    remote = list_run(api, source)
    files, left_out = select(remote, checkpoints)
    dest, first = (Path(to), None) if to else default_dest(api, source, files)
    todo = missing(files, dest)
    total = sum(r.size for r in todo)
    done_first = [first] if first else []
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"pull {source.run_id}", file=out, leave=False) as bar:
        for remote in todo:
            fetch(api, source, remote, dest)
            bar.update(remote.size)
    counts = {
        "files": len(files),
        "fetched": len(todo) + len(done_first),
        "bytes": total + sum(r.size for r in done_first),
        "kept": len(files) - len(todo) - len(done_first),
        "left_out": len(left_out),
        "left_out_bytes": sum(r.size for r in left_out),
    }
    return dest, counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agrpo pull", description=__doc__.split("\n\n", 1)[0].strip("`"))
    parser.add_argument("run", help="the run id (launcher.hf_jobs.run_id), or hf://buckets/NAMESPACE/BUCKET/RUN_ID")
    parser.add_argument("--namespace", help="user or org of the bucket (default: the token's user)")
    parser.add_argument("--bucket", default="agrpo-runs", help="the bucket's name (sync.bucket; default agrpo-runs)")
    parser.add_argument("--checkpoints", action="store_true", help="also the checkpoint-N folders (resumable state)")
    parser.add_argument("--to", help="destination folder (default outputs/<run_name>/<RUN_ID>)")
    add_replay_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        from agrpo.launchers.hf_jobs.client import resolve_namespace

        with finished_run_hub(args.replay_dir) as (api, replayed):
            namespace, bucket, run_id = parse_source(args.run, args.namespace or replayed, args.bucket)
            source = Source(f"{namespace or resolve_namespace(api, None)}/{bucket}", run_id)
            dest, counts = pull(api, source, args.to, args.checkpoints)
    except AgrpoError as error:
        print(f"agrpo pull: error: {error}", file=sys.stderr)
        return error.exit_code
    left = ""
    if counts["left_out"]:
        left = f"; {counts['left_out']} checkpoint file(s), {megabytes(counts['left_out_bytes'])}, left (--checkpoints)"
    print(
        f"agrpo pull: {source.bucket}/{run_id} -> {dest}: {counts['files']} file(s), {counts['fetched']} fetched "
        f"({megabytes(counts['bytes'])}), {counts['kept']} already here{left}"
    )
    print(f"  plot         agrpo plot {dest}\n  share        agrpo push {dest} --repo-id NAME [--private]")
    return 0
