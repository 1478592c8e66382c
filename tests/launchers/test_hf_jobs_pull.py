"""`agrpo pull` and the end of a Jobs run, against the fake Hub (tests/fakes/fake_hub.py: the Hub cannot be reached
from these machines; its bucket is a local folder, and bucket files travel as plain HTTP because Xet cannot be faked).

The run's folder in the bucket is what a trainer Job leaves (a real peft adapter, TRL's log history, TensorBoard
events, logs, a checkpoint, the replicas' adapters); the launch runs the real executor; then the commands the end of
the run printed are executed as printed: pull, plot and push (--dry-run). Evaluating the pulled adapter needs a vLLM
server: the rehearsal e2e runs that one (tests/launchers/test_rehearsal_e2e.py).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.fake_hub import FAKE_TOKEN, FakeHub, use_fake_hub

from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.pull import main as pull_main
from tests.launchers.test_hf_jobs_launch import PINNED, make_plan

REPO = Path(__file__).resolve().parents[2]
CHILD_PATCH = REPO / "tests" / "fakes" / "child"
HISTORY = [
    {"step": s, "reward": 0.1 * s, "reward_std": 0.05, "kl": 0.01 * s, "completions/mean_length": 12.0,
     "perf/step_s": 2.0, "batch/samples_per_step": 16.0}
    for s in (1, 2)
] + [{"train_runtime": 4.0, "step": 2}]  # fmt: skip
KEPT = {
    "config.yaml",
    ".hydra/overrides.yaml",
    "final_adapter/adapter_config.json",
    "final_adapter/adapter_model.safetensors",
    "metrics.json",
    "log_history.json",
    "training_curves.png",
    "tensorboard/events.out.tfevents.1",
    "logs/trainer.log",
    "logs/install.log",
    "logs/proxy.log",
}
CHECKPOINT = {"checkpoint-2/adapter_model.safetensors", "checkpoint-2/trainer_state.json"}
NEVER = {".vllm_lora/trl-policy-v2/adapter_model.safetensors", ".agrpo/agrpo-0.1.0-py3-none-any.whl"}
NEVER |= {"inputs/model/config.json"}


def write_run_folder(run: Path, adapter: Path) -> None:
    """What a finished trainer Job leaves in the run's folder (config.yaml was uploaded by the launcher)."""
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        for folder in ("final_adapter", "checkpoint-2", ".vllm_lora/trl-policy-v2"):
            if folder != "checkpoint-2" or name.endswith("safetensors"):
                (run / folder).mkdir(parents=True, exist_ok=True)
                shutil.copy(adapter / name, run / folder / name)
    (run / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (run / "metrics.json").write_text(json.dumps({"global_step": 2, "reward_first": 0.1, "reward_last": 0.2}))
    (run / "log_history.json").write_text(json.dumps(HISTORY))
    (run / "training_curves.png").write_bytes(b"\x89PNG fake")
    for path, text in (
        ("tensorboard/events.out.tfevents.1", "tb"),
        ("logs/trainer.log", "x"),
        ("logs/install.log", "p"),
    ):
        (run / path).parent.mkdir(parents=True, exist_ok=True)
        (run / path).write_text(text)
    (run / "logs" / "proxy.log").write_text("proxy")
    (run / ".hydra").mkdir(exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text("- +recipe=gsm8k\n- launcher=hf_jobs\n")
    for path in (".agrpo/agrpo-0.1.0-py3-none-any.whl", "inputs/model/config.json"):
        (run / path).parent.mkdir(parents=True, exist_ok=True)
        (run / path).write_text("not pulled")


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def bucket_run(tmp_path, monkeypatch, random_adapter_dir):
    """A fake Hub whose bucket alice/agrpo-runs holds a finished run `run1` (run_name mine); cwd is a fresh folder."""
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        bucket = tmp_path / "bucket"
        hub.buckets["alice/agrpo-runs"] = bucket
        (bucket / "run1").mkdir(parents=True)
        (bucket / "run1" / "config.yaml").write_text("run_name: mine\nmodel:\n  name_or_path: Qwen/Qwen2.5-0.5B\n")
        write_run_folder(bucket / "run1", random_adapter_dir)
        work = tmp_path / "here"
        work.mkdir()
        monkeypatch.chdir(work)
        yield hub, bucket / "run1", work


def test_pull_brings_the_results_and_leaves_the_rest(bucket_run, capsys):
    hub, run, work = bucket_run
    assert pull_main(["run1", "--namespace", "alice"]) == 0
    dest = work / "outputs" / "mine" / "run1"
    assert files_under(dest) == KEPT
    for name in KEPT:
        assert (dest / name).read_bytes() == (run / name).read_bytes()
    out = capsys.readouterr().out
    assert f"agrpo pull: alice/agrpo-runs/run1 -> outputs/mine/run1: {len(KEPT)} file(s)" in out
    assert "2 checkpoint file(s)" in out and "(--checkpoints)" in out
    assert pull_main(["run1", "--namespace", "alice"]) == 0  # again: nothing to fetch
    assert f"{len(KEPT)} file(s), 0 fetched (0.0 MB), {len(KEPT)} already here" in capsys.readouterr().out
    assert pull_main(["hf://buckets/alice/agrpo-runs/run1", "--checkpoints"]) == 0
    assert files_under(dest) == KEPT | CHECKPOINT and "2 fetched" in capsys.readouterr().out
    assert not (files_under(dest) & NEVER)
    assert all(FAKE_TOKEN not in r.path for r in hub.requests)


def test_a_cut_download_is_refused_by_size_and_resumed(bucket_run, capsys, monkeypatch):
    hub, run, work = bucket_run
    served = hub.read_file

    def truncated(bucket_id, path):
        data = served(bucket_id, path)
        return data[:10] if path.endswith("adapter_model.safetensors") and data else data

    monkeypatch.setattr(hub, "read_file", truncated)
    assert pull_main(["run1", "--namespace", "alice"]) == 1
    err = capsys.readouterr().err
    assert "final_adapter/adapter_model.safetensors: got 10 bytes where the bucket lists" in err
    dest = work / "outputs" / "mine" / "run1"
    assert not (dest / "final_adapter" / "adapter_model.safetensors").exists()  # only the .part
    assert (dest / "final_adapter" / "adapter_model.safetensors.part").stat().st_size == 10
    monkeypatch.setattr(hub, "read_file", served)
    before = len(hub.calls("GET", "/stand-in/files/"))
    assert pull_main(["run1", "--namespace", "alice"]) == 0
    fetched = len(hub.calls("GET", "/stand-in/files/")) - before
    assert files_under(dest) == KEPT  # the .part became the file once its size was right
    assert fetched < len(KEPT)  # resumed: what was complete stayed


def test_an_unknown_run_or_bucket_is_one_line(bucket_run, capsys):
    assert pull_main(["nope", "--namespace", "alice"]) == 1
    assert "bucket alice/agrpo-runs holds no run 'nope'" in capsys.readouterr().err
    assert pull_main(["run1", "--namespace", "alice", "--bucket", "other"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agrpo pull: error: cannot list bucket alice/other") and len(err.splitlines()) == 1
    assert pull_main(["a/b"]) == 1 and "neither a run id nor a bucket path" in capsys.readouterr().err


def child_env(hub) -> dict[str, str]:
    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": FAKE_TOKEN,
        "HF_HUB_OFFLINE": "0",
        "NO_PROXY": "127.0.0.1",
        "FAKE_HUB_UPLOADS": "1",
        "PYTHONPATH": os.pathsep.join([str(CHILD_PATCH), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def run_printed(line: str, hub, cwd: Path) -> subprocess.CompletedProcess:
    """A printed `agrpo ...` command, run as the console script would (agrpo = python -m agrpo)."""
    argv = shlex.split(line)
    assert argv[0] == "agrpo", line
    return subprocess.run(
        [sys.executable, "-m", "agrpo", *argv[1:]],
        cwd=cwd,
        env=child_env(hub),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_end_of_a_jobs_run_prints_its_cost_and_commands_that_work_here(
    tmp_path, monkeypatch, random_adapter_dir, capsys
):
    with FakeHub(prices={"h200": 6.0}) as hub:
        use_fake_hub(monkeypatch, hub)
        bucket = tmp_path / "bucket"
        hub.buckets["alice/agrpo-runs"] = bucket

        def trainer_job_runs(job):  # the trainer Job writes the run's folder, then completes
            job.running_s = 100 if job.spec["labels"]["agrpo-role"] == "trainer" else 140
            if job.spec["labels"]["agrpo-role"] == "trainer":
                write_run_folder(bucket / "run1", random_adapter_dir)
                job.logs, job.stage_after_logs = (
                    ["agrpo: done, 2 steps", "next:", "  plot  agrpo plot /bucket/run1"],
                    "COMPLETED",
                )

        hub.on_create = trainer_job_runs
        printed = []
        JobsRun(make_plan(hub, PINNED), make_api(), echo=printed.append).execute()  # gsm8k, 2 replicas, run1
        said = capsys.readouterr().out.splitlines()
        assert printed == ["agrpo: done, 2 steps"]  # the Job's own next: block (paths inside the Job) is not shown
        end = said[next(i for i, line in enumerate(said) if line.startswith("agrpo: HF Jobs run run1 done")) :]
        assert end[0] == "agrpo: HF Jobs run run1 done: trainer Job COMPLETED, 2 steps"
        # 2 replicas x 140 s + the trainer's 100 s at the hardware list's $6.00/h; 2 steps x 16 samples
        assert end[1] == "  cost         $0.63 for 6m20s of Job time (prices: the Jobs API's hardware list)"
        assert end[2] == "  per sample   $19.79 per 1,000 samples trained (32)"
        commands = {
            line.split()[0]: line.split(None, 1)[1] for line in end if line.startswith("  ") and "agrpo" in line
        }
        assert commands["pull"].startswith("agrpo pull run1 --namespace alice")
        assert commands["evaluate"] == "agrpo eval eval.adapter=outputs/gsm8k/run1/final_adapter"
        assert next(line for line in end if "serve" in line).split()[1:4] == [
            "vllm",
            "serve",
            "Qwen/Qwen2.5-0.5B-Instruct",
        ]
        work = tmp_path / "launching-machine"
        work.mkdir()
        pulled = run_printed(commands["pull"].split("   (")[0], hub, work)
        assert pulled.returncode == 0, pulled.stderr[-2000:]
        assert files_under(work / "outputs" / "gsm8k" / "run1") == KEPT
        plotted = run_printed(commands["plot"], hub, work)
        assert (
            plotted.returncode == 0 and (work / "outputs/gsm8k/run1/training_curves.png").read_bytes()[:4] == b"\x89PNG"
        )
        share = commands["share"].replace("NAME [--private]", "alice/run1-lora --dry-run")
        pushed = run_printed(share, hub, work)
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        assert "Would create alice/run1-lora" in pushed.stdout and "python -m agrpo +recipe=gsm8k" in pushed.stdout
        status = run_printed(commands["spend"], hub, work)
        assert status.returncode == 0 and status.stdout.splitlines()[-1].startswith("spend so far: $0.63")
