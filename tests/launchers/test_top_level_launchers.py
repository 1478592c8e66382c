"""The files in launchers/: each script is valid bash and the commands it runs work, in dry-run mode.

There is no SLURM here, so `srun` and `scontrol` are stand-ins on PATH (srun runs its command locally, scontrol
lists three made-up nodes); there is no Docker either, so the Dockerfile is checked as text (its base image, its
install line under `bash -n`) and the plan that uses its image is built.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agrpo.config.schema import HFJobsConfig
from agrpo.inference.replica_guard import REPLICA_KEY_ENV
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "launchers"
SCRIPTS = sorted(LAUNCHERS.glob("*.sbatch"))


def env_with(**extra):
    return {
        **os.environ,
        "AGRPO_PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


@pytest.fixture()
def fake_slurm(tmp_path):
    """`scontrol show hostnames` lists node-a..node-c; `srun [--opts] CMD...` runs CMD here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] || exit 9\nprintf "node-a\\nnode-b\\nnode-c\\n"\n'
    )
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def test_there_are_both_slurm_scripts_and_each_passes_bash_n():
    assert [p.name for p in SCRIPTS] == ["slurm_multi_node.sbatch", "slurm_one_node.sbatch"]
    for script in SCRIPTS:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)


def test_scripts_hold_no_hyperparameter_and_pass_their_arguments_on():
    for script in SCRIPTS:
        text = script.read_text()
        commands = [line for line in text.splitlines() if not line.startswith("#")]
        assert '"$@"' in text
        # inference.urls (the addresses of the replicas it started) and proxy.token_env (their key) are the only keys
        # a script sets
        assert not re.search(
            r"\b(lora|trainer|model|data|reward)\.\w+=|inference\.(?!urls=)\w+=", "\n".join(commands)
        ), script


def test_one_node_script_runs_python_m_agrpo_with_the_arguments(tmp_path):
    done = subprocess.run(
        [
            "bash",
            str(LAUNCHERS / "slurm_one_node.sbatch"),
            "+recipe=smoke",
            "inference.replicas=2",
            "launcher.dry_run=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("agrpo plan (local)")
    assert "[replica] vllm-0" in done.stdout and "[replica] vllm-1" in done.stdout and "[proxy] proxy" in done.stdout


@pytest.mark.parametrize("given_key", ["key-from-the-user-0123456789abcdef", None])
def test_multi_node_script_serves_a_keyed_replica_per_other_node_and_gives_the_trainer_their_urls(
    tmp_path, fake_slurm, given_key
):
    env = env_with(
        PATH=f"{fake_slurm}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_NODELIST="node-[a-c]",
        AGRPO_LAUNCHERS=str(LAUNCHERS),
    )
    env.pop("AGRPO_REPLICA_API_KEY", None)
    if given_key:
        env["AGRPO_REPLICA_API_KEY"] = given_key  # else the script makes one
    done = subprocess.run(
        [
            "bash",
            str(LAUNCHERS / "slurm_multi_node.sbatch"),
            "+recipe=gsm8k",
            "inference.max_model_len=2048",
            "launcher.dry_run=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    replicas = [line for line in done.stdout.splitlines() if line.startswith("replica on ")]
    assert len(replicas) == 2
    for line, node in zip(replicas, ("node-b", "node-c")):
        assert (
            f"-m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-0.5B-Instruct --host {node} --port 8000"
            in line
        )  # bound to the address the trainer uses, not 0.0.0.0
        assert "--max-model-len 2048" in line  # the arguments reached the replica's config
        assert "VLLM_API_KEY=<set>" in line and "--middleware agrpo.inference.replica_guard.ReplicaGuard" in line
    plan = done.stdout[done.stdout.index("agrpo plan (local)") :]
    assert "[replica]" not in plan  # the trainer node starts no replica
    assert "--upstream http://node-b:8000 --upstream http://node-c:8000" in plan
    assert "--token-env AGRPO_REPLICA_API_KEY" in plan  # the proxy sends the replicas' key
    if given_key:
        assert given_key not in done.stdout + done.stderr


def test_multi_node_script_refuses_a_single_node(tmp_path, fake_slurm):
    (fake_slurm / "scontrol").write_text("#!/bin/bash\necho node-a\n")
    env = env_with(PATH=f"{fake_slurm}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_NODELIST="node-a")
    done = subprocess.run(
        ["bash", str(LAUNCHERS / "slurm_multi_node.sbatch"), "+recipe=gsm8k"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "use slurm_one_node.sbatch" in done.stderr


def serve_replica_module():
    spec = importlib.util.spec_from_file_location("serve_replica", LAUNCHERS / "serve_replica.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serve_replica_needs_a_key_and_an_address_others_can_reach():
    serve = serve_replica_module()
    assert serve.REPLICA_KEY_ENV == REPLICA_KEY_ENV
    assert serve.key_problem("k") is None
    assert "proxy.token_env=AGRPO_REPLICA_API_KEY" in serve.key_problem("  ")
    assert serve.bind_problem("node-b", ["10.1.2.3"]) is None
    assert serve.bind_problem("0.0.0.0", ["0.0.0.0"]) is None
    assert serve.bind_problem("127.0.0.1", ["127.0.0.1"]) is None  # loopback when asked for as such
    assert serve.bind_problem("node-b", []) is None  # unresolvable here: vLLM says so itself
    problem = serve.bind_problem("node-b", ["127.0.1.1"])
    assert "127.0.1.1" in problem and "AGRPO_REPLICA_HOST" in problem


def test_serve_replica_without_a_key_refuses_in_one_paragraph(tmp_path):
    env = env_with()
    env.pop("AGRPO_REPLICA_API_KEY", None)
    done = subprocess.run(
        [sys.executable, str(LAUNCHERS / "serve_replica.py"), "+recipe=gsm8k", "launcher.dry_run=true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no API key" in done.stderr and done.stdout == ""


def test_serve_replica_names_a_bad_override_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(LAUNCHERS / "serve_replica.py"), "+recipe=gsm8k", "lora.bogus=1", "launcher.dry_run=true"],
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "bogus" in done.stderr


def test_dockerfile_builds_the_pinned_vllm_image_plus_the_wheel_and_is_the_trainer_image_the_plan_runs():
    text = (LAUNCHERS / "Dockerfile").read_text()
    base = re.search(r"^ARG VLLM_IMAGE=(\S+)$", text, re.M).group(1)
    assert base == HFJobsConfig.trainer_image == HFJobsConfig.replica_image
    version = tuple(int(x) for x in re.fullmatch(r"vllm/vllm-openai:v(\d+)\.(\d+)\.(\d+)", base).groups())
    trl_check = (Path(__import__("trl").__file__).parent / "import_utils.py").read_text()
    low, high = re.search(r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', trl_check).groups()
    assert tuple(map(int, low.split("."))) <= version <= tuple(map(int, high.split(".")))
    run = re.search(r"^RUN (.*?)(?=^\S)", text, re.M | re.S).group(1).replace("\\\n", " ")
    assert subprocess.run(["bash", "-n", "-c", run]).returncode == 0
    assert '--constraint /tmp/pins.txt /tmp/wheels/agrpo-*.whl "trl[kernels]==1.16.*"' in run
    cfg = spec_for(
        "+recipe=gsm8k",
        "launcher=hf_jobs",
        "sync=bucket",
        "launcher.hf_jobs.run_id=img1",
        "launcher.hf_jobs.trainer_image=me/agrpo-trainer:0.1.0",
        "launcher.hf_jobs.trainer_image_has_agrpo=true",
    )
    plan = build_jobs_plan(cfg)
    assert plan.wheel is None and plan.trainer.image == "me/agrpo-trainer:0.1.0"
    assert plan.trainer.command == ["python3", "-m", "agrpo.launchers.hf_jobs.trainer", "/bucket/img1/config.yaml"]
