"""One prepare step (compose -> validate -> resolve) behind every entrypoint, and downstream code that reads what it
resolved instead of deriving it again (agrpo/config/prepare.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.config.spec import with_values
from agrpo.errors import ConfigError
from tests.processes import Drained

REPO = Path(__file__).resolve().parents[2]
BAD = "+lora.bogus=1"  # composes (a `+` key), then the validation pass refuses it
PARAGRAPH = "invalid config (1 problem): lora.bogus is not a config key: remove it."


def prepared(*overrides: str, cuda: bool = False, output_dir: str = "/tmp/agrpo-prepare"):
    return prepare(compose_run_config(["+recipe=smoke", *overrides], output_dir=output_dir), cuda_available=cuda)


def command(*argv: str, cwd: Path) -> Drained:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return Drained(argv, cwd=cwd, env=env)  # three at once, each read as it comes (tests/processes.py)


def test_every_entrypoint_refuses_a_bad_override_with_the_runs_paragraph(tmp_path):
    """`python -m agrpo`, `agrpo eval` and serve_replica: exit 2, one paragraph, the same words, nothing started."""
    started = {
        "agrpo": command(sys.executable, "-m", "agrpo", "+recipe=smoke", BAD, "launcher.dry_run=true", cwd=tmp_path),
        "agrpo eval": command(sys.executable, "-m", "agrpo", "eval", "+recipe=smoke", BAD, cwd=tmp_path),
        "serve_replica": command(
            sys.executable,
            str(REPO / "launchers" / "serve_replica.py"),
            "+recipe=smoke",
            BAD,
            "launcher.dry_run=true",
            cwd=tmp_path,
        ),
    }
    for name, process in started.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, (name, err[-2000:])
        assert err.strip() == f"{name}: error: {PARAGRAPH}", name
        assert out == "" and "Traceback" not in err
    assert not (tmp_path / "outputs").exists()  # nothing of a run (or an evaluation) was created


def test_a_hydra_refused_override_is_a_config_error_outside_hydras_main():
    from agrpo.config.prepare import compose_overrides

    with pytest.raises(ConfigError, match="invalid override: .*lora.bogus") as error:
        compose_overrides(["+recipe=smoke", "lora.bogus=1"])
    assert error.value.exit_code == 2


def test_the_trainer_job_prepares_its_uploaded_config(tmp_path, monkeypatch):
    """The in-Job trainer validates once (the one pass, Jobs checks included) and reads resolved values."""
    from omegaconf import OmegaConf

    from agrpo.launchers.hf_jobs import trainer

    run_dir = tmp_path / "run1"
    cfg = compose_run_config(
        [
            "+recipe=smoke",
            "launcher=hf_jobs",
            "sync=bucket",
            "role=trainer",
            "inference.use_proxy=true",
            "proxy.token_env=HF_TOKEN",
            "launcher.hf_jobs.run_id=run1",
            "launcher.hf_jobs.namespace=alice",
            f"sync.mount_path={tmp_path}",
            f"sync.output_dir={run_dir}",
        ]
    )
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    monkeypatch.setattr(trainer, "replica_urls", lambda cfg, api, launch_id: ["https://a--8000.hf.jobs"])
    loaded = trainer.load_job_config(str(path), api=None)
    assert loaded.inference.max_loras == loaded.trainer.max_staleness + 2 and loaded.inference.device == "cpu"
    cfg.trainer.max_steps = 0
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    with pytest.raises(ConfigError, match=r"invalid config \(1 problem\): trainer.max_steps must be >= 1"):
        trainer.load_job_config(str(path), api=None)


def test_the_dry_run_refuses_a_run_dir_holding_an_earlier_run():
    """The run-dir check is in the validation pass: a dry run refuses what the run would."""
    import tempfile

    with tempfile.TemporaryDirectory() as run_dir:
        (Path(run_dir) / "metrics.json").write_text("{}")
        with pytest.raises(ConfigError, match="already holds an earlier run's outputs"):
            prepared("launcher.dry_run=true", output_dir=run_dir)
        assert prepared("trainer.resume=true", output_dir=run_dir).trainer.resume.lower() == "true"  # continues it


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("sync.kind=storage", "agrpo/sync/storage.py registers no adapter store"),
        ("launcher.accelerate.num_processes=0", "launcher.accelerate.num_processes=0 must be >= 1"),
        ("eval.k=0", "eval.k=0 must be >= 1"),
    ],
)
def test_checks_that_failed_late_fail_in_the_one_pass(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        prepared(override)


def test_activation_checkpointing_twice_is_refused_by_the_pass():
    with pytest.raises(ConfigError, match="trainer.gradient_checkpointing"):
        prepared(
            "launcher=accelerate",
            "launcher.accelerate.activation_checkpointing=true",
            "trainer.gradient_checkpointing=true",
        )


# ---- downstream reads the resolved values ----------------------------------------------------------------------


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_the_replica_command_serves_what_resolve_decided():
    """LoRA rank, LoRA count and dtype on the replica's command line are the resolved config's, whatever they are."""
    from agrpo.inference.vllm_server import build_replica_launch

    cfg = prepared("lora.r=4")
    assert (cfg.inference.max_lora_rank, cfg.inference.max_loras, cfg.inference.dtype) == (8, 3, "float32")
    cfg = with_values(cfg, {"inference.max_lora_rank": 64, "inference.max_loras": 9, "inference.dtype": "bfloat16"})
    argv = build_replica_launch(cfg, 8000, cfg.inference.device).argv
    assert (flag(argv, "--max-lora-rank"), flag(argv, "--max-loras"), flag(argv, "--dtype")) == ("64", "9", "bfloat16")


def test_the_local_plan_runs_on_the_resolved_device(monkeypatch):
    """resolve decided cpu for this run; the plan (and so every replica) follows it, not torch's answer now."""
    import torch

    from agrpo.launchers.local import plan_on_this_machine

    cfg = prepared("inference.device=auto")
    assert cfg.inference.device == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    plan = plan_on_this_machine(cfg, "/tmp/agrpo-prepare")
    assert "--distributed-executor-backend" in plan.services[0].argv  # vLLM's CPU flags
    cfg = with_values(cfg, {"inference.device": "cuda"})  # a resolved value wins over the machine
    plan = plan_on_this_machine(cfg, "/tmp/agrpo-prepare")
    assert "--gpu-memory-utilization" in plan.services[0].argv


def test_proxy_or_not_is_one_resolved_value_for_the_plan_and_the_trainer():
    """Two replica URLs with use_proxy=false: no proxy in the plan, and the trainer does not treat its URL as one
    (it used to: `num_replicas > 1 or use_proxy`)."""
    from agrpo.launchers.local import build_local_plan

    cfg = prepared("inference.urls=[http://127.0.0.1:9001,http://127.0.0.1:9002]", "inference.use_proxy=false")
    plan = build_local_plan(cfg, "/tmp/r", "cpu", 0, [0, 1])
    assert [s.role for s in plan.services] == [] and cfg.inference.use_proxy is False
    two = prepared("inference.replicas=2")
    assert (
        two.inference.use_proxy is True
        and [s.role for s in build_local_plan(two, "/tmp/r", "cpu", 0, [0, 1]).services][-1] == "proxy"
    )


def test_the_jobs_replicas_serve_on_the_resolved_device():
    from agrpo.launchers.hf_jobs.planner import replica_job

    cfg = prepared(
        "launcher=hf_jobs",
        "sync=bucket",
        "launcher.hf_jobs.run_id=r1",
        "sync.mount_path=/bucket",
        "sync.output_dir=/bucket/r1",
        cuda=True,
        output_dir=None,
    )
    assert cfg.inference.device == "cuda"
    assert "--gpu-memory-utilization" in replica_job(cfg, 0, "ns/runs", "r1", "L1").command
    cpu = with_values(cfg, {"inference.device": "cpu"})
    assert "--distributed-executor-backend" in replica_job(cpu, 0, "ns/runs", "r1", "L1").command


RULES = {  # token sequences only agrpo/config/resolve.py may hold (strings other than these names are blanked)
    "max_staleness + 2": "the served LoRA count",
    '"float32" if': "the served dtype",
    "VLLM_LORA_RANKS =": "vLLM's LoRA ranks",
    '"cuda" if': "the device",
}
KEPT_STRINGS = {'"float32"', '"cuda"'}


def code_lines(path: Path) -> list[str]:
    """Each line's tokens joined by spaces, comments dropped and string literals blanked (messages may name a rule)."""
    import io
    import tokenize

    lines: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        text = token.string if token.type != tokenize.STRING or token.string in KEPT_STRINGS else "STR"
        lines.setdefault(token.start[0], []).append(text)
    return [" ".join(tokens) for tokens in lines.values()]


def test_no_derivation_is_copied_outside_resolve():
    """Each derived value has one rule (agrpo/config/resolve.py); a copy elsewhere is how they drifted apart."""
    found = []
    for path in sorted((REPO / "agrpo").rglob("*.py")):
        if path == REPO / "agrpo" / "config" / "resolve.py":
            continue
        for line in code_lines(path):
            found += [f"{path.relative_to(REPO)}: {what}: {line}" for rule, what in RULES.items() if rule in line]
    assert found == []


RULE_FUNCTIONS = ("served_device", "served_dtype", "served_lora_rank", "served_max_loras", "uses_proxy", "queue_size")
RULE_FUNCTIONS += ("inflight_slots", "derived_values")  # a spec without a run config: resolve.resolved_defaults


def test_no_rule_is_applied_again_downstream():
    """Downstream code reads the spec's value (prepare resolved it) instead of calling resolve's rule on it again:
    only agrpo/config applies a rule (the spec's builders included)."""
    import ast

    found = []
    for path in sorted((REPO / "agrpo").rglob("*.py")):
        if path.is_relative_to(REPO / "agrpo" / "config"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "agrpo.config.resolve":
                found += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name in RULE_FUNCTIONS]
    assert found == []
