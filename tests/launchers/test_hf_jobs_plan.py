"""The HF Jobs plan (pure): replica and trainer Jobs, the trainer Job's install and config, dry run, cost, checks.

No Hub is involved here (plans are plain data); the tests that talk to the Jobs API use a fake Hub server because
the real one cannot be reached from these machines.
"""

import os
import shlex

import pytest
from omegaconf import OmegaConf

from agrpo.cli import run
from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems
from agrpo.errors import ConfigError
from agrpo.inference.vllm_server import build_replica_launch
from agrpo.config.hf_jobs_checks import hf_jobs_problems
from agrpo.launchers.hf_jobs.plan import PRICE_PER_HOUR_USD, bind_namespace
from agrpo.launchers.hf_jobs.planner import GPU_EXTRAS, build_jobs_plan, vllm_serve_argv
from tests.specs import spec_for, with_values

BASE = ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"]
IMAGE = "vllm/vllm-openai:v0.31.0"


def jobs_cfg(*overrides):
    return compose_run_config([*BASE, *overrides])


def jobs_spec(*overrides):
    return spec_for(*BASE, *overrides)


def test_two_replica_plan_serves_the_local_vllm_flags_with_the_images_vllm_serve():
    cfg = jobs_spec("inference.replicas=2", "launcher.hf_jobs.namespace=alice")
    plan = build_jobs_plan(cfg, launch_id="L1")
    assert [job.name for job in plan.replicas] == ["run1-vllm-0", "run1-vllm-1"]
    replica = plan.replicas[0]
    local = build_replica_launch(with_values(cfg, {"inference.host": "0.0.0.0"}), 8000, "cuda", None, "python3").argv
    assert replica.command == vllm_serve_argv(local)
    assert replica.command[:3] == ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"] and "--model" not in replica.command
    assert replica.command[3:] == local[5:]  # every flag the local launcher derives, after the model
    assert replica.command[replica.command.index("--max-loras") + 1] == "6"  # max_staleness 4 + 2
    assert (replica.image, replica.flavor, replica.expose, replica.timeout_s) == (IMAGE, "h200", [8000], 21600)
    assert replica.volumes == [{"source": "alice/agrpo-runs", "mount_path": "/bucket", "read_only": True}]
    assert replica.labels == {"agrpo-run": "run1", "agrpo-role": "replica", "agrpo-launch": "L1"}
    assert plan.replica_url("a1") == "https://a1--8000.hf.jobs"
    assert plan.trainer.volumes[0]["read_only"] is False and plan.trainer.expose == []
    assert plan.run_dir == "/bucket/run1"


def test_module_entrypoint_stays_available_for_images_without_the_vllm_command():
    plan = build_jobs_plan(jobs_spec("launcher.hf_jobs.replica_vllm_serve=false"))
    assert plan.replicas[0].command[:5] == [
        "python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "Qwen/Qwen2.5-0.5B-Instruct",
    ]


def test_trainer_job_installs_the_uploaded_wheel_without_moving_the_images_vllm_and_runs_the_uploaded_config():
    plan = build_jobs_plan(jobs_spec("launcher.hf_jobs.namespace=alice"), launch_id="L1")
    wheel = plan.wheel
    assert wheel.filename.startswith("agrpo-") and wheel.filename.endswith("-py3-none-any.whl")
    assert wheel.path_in_bucket == f"run1/.agrpo/{wheel.filename}"
    assert wheel.argv("/tmp/w")[1:] == [
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        "/tmp/w",
        "/tmp/w/src",
    ]
    command = plan.trainer.command
    assert command[:2] == ["bash", "-c"]
    script = command[2]
    assert 'pip freeze 2>/dev/null | grep -iE "^(vllm|torch|transformers)=="' in script
    assert '--constraint "$pins"' in script and "$(seq 3)" in script and 'exec "$@"' in script
    assert command[3:] == [
        "agrpo-install",
        f"/bucket/run1/.agrpo/{wheel.filename}",
        GPU_EXTRAS,
        "--",
        "python3",
        "-m",
        "agrpo.launchers.hf_jobs.trainer",
        "/bucket/run1/config.yaml",
    ]
    assert plan.config.path_in_bucket == "run1/config.yaml"
    assert plan.trainer.env == {"AGRPO_LAUNCH_ID": "L1"} and plan.trainer.secrets == ["HF_TOKEN"]
    assert "agrpo" not in [a for a in command if " " not in a][4:6]  # never a bare index name


def test_the_install_script_runs_under_bash_and_execs_the_trainer_after_pip(tmp_path):
    """The script itself, with a stand-in python that records its calls: constraints, retries, then exec."""
    import subprocess

    plan = build_jobs_plan(jobs_spec("launcher.hf_jobs.namespace=alice", "launcher.hf_jobs.install_attempts=2"))
    log = tmp_path / "calls"
    fake_python = tmp_path / "python3"
    fake_python.write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n'
        'if [ "$3" = freeze ]; then echo vllm==0.31.0; echo torch==2.9.0; echo requests==2.0; fi\n'
        f'if [ "$3" = install ]; then cat "$6" >> {log}; fi\n'
    )
    fake_python.chmod(0o755)
    command = [str(fake_python) if a == "python3" else a for a in plan.trainer.command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "-m pip freeze"
    assert calls[1].startswith("-m pip install --no-cache-dir --constraint /tmp/")
    assert calls[1].endswith(f"/bucket/run1/.agrpo/{plan.wheel.filename} {GPU_EXTRAS}")
    assert calls[2:] == [
        "vllm==0.31.0",
        "torch==2.9.0",  # the image's versions pinned, nothing else
        "-m agrpo.launchers.hf_jobs.trainer /bucket/run1/config.yaml",
    ]


def test_the_install_is_retried_with_growing_waits_and_the_trainer_runs_only_after_it_succeeds(tmp_path):
    """pip fails once, then succeeds: two installs, one wait (a stand-in `sleep` records it), then the trainer.
    With every attempt failing the Job ends with code 1 and the trainer never starts."""
    import subprocess

    log = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text(f'#!/bin/bash\necho "sleep $1" >> {log}\n')
    (bin_dir / "python3").write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n'
        f'if [ "$3" = install ] && [ ! -e {tmp_path}/failed_once -o -e {tmp_path}/always_fail ]; then\n'
        f"  touch {tmp_path}/failed_once; exit 1\nfi\n"
    )
    for tool in ("sleep", "python3"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    plan = build_jobs_plan(jobs_spec("launcher.hf_jobs.install='agrpo==0.1.0'", "launcher.hf_jobs.install_attempts=3"))
    done = subprocess.run(plan.trainer.command, env=env, capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines()
    assert done.returncode == 0, done.stderr
    assert [c.split()[2] if c.startswith("-m pip") else c for c in calls] == [
        "freeze",
        "install",
        "sleep 15",
        "install",
        "-m agrpo.launchers.hf_jobs.trainer /bucket/run1/config.yaml",
    ]
    assert "pip install failed (attempt 1 of 3)" in done.stderr
    log.unlink()
    (tmp_path / "always_fail").touch()
    done = subprocess.run(plan.trainer.command, env=env, capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines()
    assert done.returncode == 1 and "pip install failed (attempt 3 of 3)" in done.stderr
    assert [c for c in calls if c.startswith("sleep")] == ["sleep 15", "sleep 30"]  # no wait after the last
    assert not any("agrpo.launchers.hf_jobs.trainer" in c for c in calls)


def test_pinned_requirement_and_prebuilt_image_replace_the_wheel():
    pinned = build_jobs_plan(
        jobs_spec("launcher.hf_jobs.install='agrpo==0.1.0'", "launcher.hf_jobs.trainer_flavor=cpu-upgrade")
    )
    assert pinned.wheel is None
    assert pinned.trainer.command[3:6] == ["agrpo-install", "agrpo==0.1.0", "--"]  # no kernels on a CPU flavor
    prebuilt = build_jobs_plan(
        jobs_spec("launcher.hf_jobs.trainer_image=me/agrpo-trainer:1", "launcher.hf_jobs.trainer_image_has_agrpo=true")
    )
    assert prebuilt.wheel is None and prebuilt.trainer.image == "me/agrpo-trainer:1"
    assert prebuilt.trainer.command == ["python3", "-m", "agrpo.launchers.hf_jobs.trainer", "/bucket/run1/config.yaml"]


def test_the_uploaded_config_is_the_resolved_run_config_with_the_trainer_jobs_role():
    cfg = jobs_spec(
        "inference.replicas=2", "lora.r=1", "trainer.learning_rate=3e-5", "launcher.hf_jobs.namespace=alice"
    )
    job = OmegaConf.create(build_jobs_plan(cfg).config.text)
    assert (job.lora.r, job.trainer.learning_rate, job.inference.replicas) == (1, 3e-5, 2)
    assert (job.role, job.inference.use_proxy, job.proxy.token_env) == ("trainer", True, "HF_TOKEN")
    assert (job.sync.bucket, job.sync.output_dir, job.launcher.hf_jobs.namespace) == (
        "alice/agrpo-runs",
        "/bucket/run1",
        "alice",
    )
    assert list(job.inference.urls) == [] and job.launcher.dry_run is False
    assert "${" not in build_jobs_plan(cfg).config.text  # every interpolation resolved


def test_a_user_recipe_file_and_an_override_reach_the_trainer_jobs_config_unchanged(tmp_path):
    (tmp_path / "recipe").mkdir()
    # A name no other test stores in Hydra's (process-wide) ConfigStore, which +recipe=<path> uses.
    (tmp_path / "recipe" / "mine_for_jobs.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /recipe/gsm8k\nrun_name: mine\nlora:\n  alpha: 7\n"
    )
    cfg = spec_for(
        f"hydra.searchpath=[file://{tmp_path}]",
        "+recipe=mine_for_jobs",
        "launcher=hf_jobs",
        "sync=bucket",
        "launcher.hf_jobs.run_id=run1",
        "trainer.top_p=0.93",
        "launcher.hf_jobs.namespace=alice",
    )
    plan = build_jobs_plan(cfg)
    job = OmegaConf.create(plan.config.text)
    assert (job.run_name, job.lora.alpha, job.trainer.top_p, job.data.name) == ("mine", 7, 0.93, "gsm8k")
    assert "recipe" not in " ".join(plan.trainer.command)  # the Job never re-composes from overrides


def test_cost_estimate_sums_every_job_and_names_unknown_flavors():
    plan = build_jobs_plan(jobs_spec("inference.replicas=2"))
    assert plan.cost_per_hour() == (3 * PRICE_PER_HOUR_USD["h200"], [])
    bigger = build_jobs_plan(jobs_spec("launcher.hf_jobs.trainer_flavor=h200x2"))
    assert bigger.cost_per_hour() == (PRICE_PER_HOUR_USD["h200"] + PRICE_PER_HOUR_USD["h200x2"], [])
    # A flavor huggingface_hub knows (the validation pass refuses others) that agrpo's price table does not.
    odd = build_jobs_plan(with_values(jobs_spec(), {"launcher.hf_jobs.replica_flavor": "future-gpu"}))
    assert odd.cost_per_hour() == (PRICE_PER_HOUR_USD["h200"], ["future-gpu"])
    assert "no price known for ['future-gpu']" in odd.render()


def test_binding_the_namespace_changes_only_the_placeholder():
    plan = build_jobs_plan(jobs_spec("inference.replicas=2"), launch_id="L1")
    bound = bind_namespace(plan, "alice")
    named = build_jobs_plan(jobs_spec("inference.replicas=2", "launcher.hf_jobs.namespace=alice"), launch_id="L1")
    named.notes = bound.notes
    assert bound == named


def test_dry_run_prints_every_job_field_the_executor_submits_and_never_a_secret(capsys, monkeypatch):
    secret = "hf_DRYRUN_secret_value"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value")
    cfg = jobs_cfg("inference.replicas=2", "launcher.dry_run=true", "launcher.hf_jobs.secrets=[HF_TOKEN,WANDB_API_KEY]")
    assert run(cfg) == {}
    out = capsys.readouterr().out
    assert secret not in out and "wandb_secret_value" not in out
    assert out.startswith("agrpo plan (hf_jobs), run id run1, launch ")
    assert "estimated cost: $15.00/hour for 2 replica Job(s) + 1 trainer Job" in out
    for expected in (
        "[replica] run1-vllm-0",
        "[replica] run1-vllm-1",
        "[trainer] run1-trainer",
        f"image: {IMAGE}  flavor: h200 (~$5.00/h)",
        "timeout: 21600 s",
        "secrets: HF_TOKEN WANDB_API_KEY (values never shown)",
        "volume: bucket <namespace>/agrpo-runs -> /bucket (read-only)",
        "volume: bucket <namespace>/agrpo-runs -> /bucket (read-write)",
        "ports: 8000 -> https://<vllm-1-job-id>--8000.hf.jobs",
        "env: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 VLLM_LOGGING_LEVEL=INFO VLLM_SERVER_DEV_MODE=1",
        "cmd: vllm serve Qwen/Qwen2.5-0.5B-Instruct --host 0.0.0.0",
        "prepare: upload the resolved run config",
        "to bucket <namespace>/agrpo-runs:run1/config.yaml",
        "-m pip wheel --no-deps --no-build-isolation",
    ):
        assert expected in out, expected


def test_an_interpolated_secret_is_refused_pointing_at_the_secrets_key(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_should_never_show")
    cfg = jobs_cfg("+proxy.token='${oc.env:HF_TOKEN}'")
    problems = hf_jobs_problems(cfg)
    assert any("proxy.token reads the secret HF_TOKEN" in p and "launcher.hf_jobs.secrets" in p for p in problems)
    with pytest.raises(ConfigError, match="run_name reads the secret HF_TOKEN") as error:
        jobs_spec("run_name='${oc.env:HF_TOKEN}'")  # the validation pass refuses it: no plan is built
    assert "hf_should_never_show" not in str(error.value)
    other = jobs_cfg("+logger.extra_key='${oc.env:MY_SERVICE_PASSWORD,x}'")
    assert any("MY_SERVICE_PASSWORD" in p for p in hf_jobs_problems(other))
    assert hf_jobs_problems(jobs_cfg("+logger.where='${oc.env:HOME}'")) == []  # not a secret


def test_a_secret_value_written_literally_is_refused(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_literal_secret_123")
    with pytest.raises(ConfigError, match=r"secret\(s\) \['HF_TOKEN'\] is written in the config at \['run_name'\]"):
        build_jobs_plan(jobs_spec("run_name=hf_literal_secret_123"))


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["+recipe=smoke", "launcher=hf_jobs"], "launcher=hf_jobs needs sync=bucket"),
        ([*BASE, "inference.device=cpu"], "set inference.device=auto or cuda"),
        ([*BASE, "launcher.hf_jobs.run_id='a b'"], "launcher.hf_jobs.run_id='a b' may hold only"),
        (
            [*BASE, "launcher.hf_jobs.run_id=run.1"],
            "launcher.hf_jobs.run_id='run.1' may hold only letters, digits, '_'",
        ),
        ([*BASE, "+launcher.hf_jobs.labels.team=r.l"], "launcher.hf_jobs.labels.team='r.l'"),
        ([*BASE, "launcher.hf_jobs.install=agrpo"], "launcher.hf_jobs.install='agrpo' is a bare package name"),
        (
            [*BASE, "launcher.hf_jobs.install='agrpo==1.0'", "launcher.hf_jobs.trainer_image_has_agrpo=true"],
            "contradict each other",
        ),
        ([*BASE, "launcher.hf_jobs.trainer_attempts=0"], "trainer_attempts must be >= 1"),
        ([*BASE, "launcher.hf_jobs.trainer_launcher=slurm"], "trainer_launcher='slurm' must be local or accelerate"),
        ([*BASE, "sync.output_dir=/elsewhere/run1"], "is not under sync.mount_path='/bucket'"),
        ([*BASE, "sync.mount_path=bucket"], "must be an absolute path"),
        ([*BASE, "sync.bucket='a/b/c'"], "must be 'name' or 'namespace/name'"),
    ],
)
def test_bad_combinations_name_the_key_to_change(overrides, fragment):
    problems = hf_jobs_problems(compose_run_config(overrides, output_dir=None))
    assert any(fragment in p for p in problems), problems


def test_a_dotted_run_id_fails_the_dry_run_naming_the_key(capsys):
    with pytest.raises(ConfigError, match=r"launcher\.hf_jobs\.run_id='run\.1'"):
        run(jobs_cfg("launcher.hf_jobs.run_id=run.1", "launcher.dry_run=true"))
    assert capsys.readouterr().out == ""


def test_the_gsm8k_jobs_config_is_valid():
    assert find_problems(jobs_cfg()) == [] and hf_jobs_problems(jobs_cfg()) == []


def test_the_sanity_recipe_is_the_blogs_run_on_jobs():
    """The reference topology and every number the blog gives (recipes/sanity.md lists what still differs)."""
    cfg = compose_run_config(["+recipe=sanity", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=s1"])
    assert find_problems(cfg) == [] and hf_jobs_problems(cfg) == []
    t = cfg.trainer
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-Math-1.5B" and (cfg.lora.r, cfg.lora.alpha) == (1, 2)
    assert (t.learning_rate, t.extra.adam_beta2, t.num_generations) == (4e-5, 0.95, 8)
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps * 2 == 128 and t.token_budget == 0
    assert (t.max_completion_length, cfg.inference.max_model_len) == (3000, 4096)
    assert (t.max_staleness, t.weight_sync_steps, int(t.max_inflight_tasks), t.queue_maxsize, t.save_steps) == (
        4,
        4,
        128,
        512,
        20,
    )
    assert t.gradient_checkpointing is True
    assert cfg.data.system_prompt == r"Please reason step by step, and put your final answer within \boxed{}."
    plan = build_jobs_plan(spec_for("+recipe=sanity", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=s1"))
    assert [(j.flavor, j.image) for j in plan.jobs()] == [("h200", IMAGE)] * 2 + [("h200x2", IMAGE)]
    served = plan.replicas[0].command
    assert served[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Math-1.5B"]
    assert served[served.index("--max-cpu-loras") + 1] == "12" and served[served.index("--max-loras") + 1] == "6"
    assert served[served.index("--generation-config") + 1] == "vllm"
    job = OmegaConf.create(plan.config.text)
    assert job.launcher.hf_jobs.trainer_launcher == "accelerate"  # FSDP2 over the h200x2 trainer's 2 GPUs
    assert plan.cost_per_hour() == (20.0, [])


def test_rendered_commands_round_trip_through_a_shell():
    plan = build_jobs_plan(jobs_spec())
    line = next(li for li in plan.render().splitlines() if li.startswith("  cmd: bash"))
    assert shlex.split(line[len("  cmd: ") :]) == plan.trainer.command
