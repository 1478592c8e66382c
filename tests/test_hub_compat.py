"""agrpo works with both huggingface_hub lines (agrpo/hub_compat.py). These run against whichever line is installed:
2.x in the CPU set-up (`make test`), 1.33 in the GPU set-up's versions (`make test-gpu-versions`), and each asserts
what that line must do. The source scan fails when a call site sends an argument the installed HfApi lacks."""

from __future__ import annotations

import ast
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import HfApi

from agrpo import hub_compat
from agrpo.config.compose import compose_run_config
from agrpo.hub_compat import HubTooOld, accepts, hub_api_accepts, supported_kwargs

PACKAGE = Path(__file__).resolve().parent.parent / "agrpo"
HUB_MAJOR = int(huggingface_hub.__version__.split(".")[0])


def test_the_2x_only_arguments_are_exactly_those_the_installed_line_lacks_or_has():
    for method, name in hub_compat.HUB_2_ONLY:
        assert hub_api_accepts(method, name) is (HUB_MAJOR >= 2), f"HfApi.{method}({name}=) on {HUB_MAJOR}.x"


def test_run_job_takes_attempts_on_2x_and_only_the_pinned_1x_line_may_skip_the_tests_that_send_it():
    """The Jobs rehearsal e2e and the requeue tests send run_job(attempts=): tests/hub_lines.py skips them on the 1.x
    line alone, so under 2.x a release that renames the argument fails here, naming it, and fails them too."""
    from hub_lines import needs_run_job_attempts

    from tests.skip_policy import pinned_hub_version

    assert needs_run_job_attempts.args == (HUB_MAJOR < 2,)  # the line decides, never the argument's presence
    if HUB_MAJOR >= 2:
        assert hub_api_accepts("run_job", "attempts"), (
            f"huggingface_hub {huggingface_hub.__version__}'s HfApi.run_job has no `attempts=`: agrpo's trainer "
            "requeue (launcher.hf_jobs.trainer_attempts) needs it; follow the rename in agrpo/hub_compat.py"
        )
    else:
        assert huggingface_hub.__version__ == pinned_hub_version(), "1.x only as constraints/gpu-versions.txt pins it"
        assert not hub_api_accepts("run_job", "attempts")


class Hub1:  # the shape of each line's HfApi.run_job, in small
    def run_job(self, *, image, command, namespace=None, timeout=None):
        return image, command, namespace, timeout


class Hub2:
    def run_job(self, *, image, command, namespace=None, timeout=None, attempts=None):
        return image, command, namespace, timeout, attempts


run_job_1x, run_job_2x = Hub1().run_job, Hub2().run_job


def test_unset_arguments_the_method_lacks_are_dropped_and_set_ones_refused_naming_key_and_upgrade():
    kwargs = {"image": "img", "command": ["true"], "attempts": None}
    assert supported_kwargs(run_job_1x, kwargs) == {"image": "img", "command": ["true"]}
    assert supported_kwargs(run_job_2x, kwargs) == kwargs
    assert supported_kwargs(run_job_2x, {**kwargs, "attempts": 3})["attempts"] == 3
    with pytest.raises(HubTooOld) as refused:
        supported_kwargs(run_job_1x, {**kwargs, "attempts": 3})
    message = str(refused.value)
    assert message.startswith("launcher.hf_jobs.trainer_attempts=3 needs the platform's requeue")
    assert "huggingface_hub 2.0" in message and "make setup" in message


def test_a_stand_in_taking_kwargs_takes_everything():
    assert accepts(lambda **kwargs: None, "attempts")


def test_the_executors_run_job_arguments_fit_the_installed_hfapi():
    from agrpo.launchers.hf_jobs.plan import JobSpec

    spec = JobSpec(
        name="r", role="trainer", image="img", flavor="h200", command=["true"], env={}, secrets=[], labels={},
        volumes=[{"source": "alice/b", "mount_path": "/bucket", "read_only": False}], timeout_s=60, expose=[8000],
    )  # fmt: skip
    sent = supported_kwargs(HfApi().run_job, spec.run_job_kwargs("alice", {}))
    assert all(accepts(HfApi.run_job, name) for name in sent)
    spec.attempts = 2
    if HUB_MAJOR >= 2:
        assert supported_kwargs(HfApi().run_job, spec.run_job_kwargs("alice", {}))["attempts"] == 2
    else:
        with pytest.raises(HubTooOld, match="trainer_attempts=2"):
            supported_kwargs(HfApi().run_job, spec.run_job_kwargs("alice", {}))


def receiver_name(call: ast.Call) -> str:
    receiver = call.func.value
    return receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")


def hub_calls() -> list[tuple[str, int, str, ast.Call, str]]:
    """Every `<...>api.<HfApi method>(...)` call in agrpo's source: (file, line, method, call, enclosing source)."""
    methods = {name for name in dir(HfApi) if not name.startswith("_")}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for function in functions:
            enclosing = ast.get_source_segment(source, function)
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                name = receiver_name(node)
                if node.func.attr in methods and (name == "api" or name.endswith("_api")):
                    found.append((path.name, node.lineno, node.func.attr, node, enclosing))
    return found


def test_every_hfapi_call_in_agrpo_sends_only_arguments_the_installed_line_takes():
    calls = hub_calls()
    assert {"run_job", "list_jobs", "cancel_job", "create_bucket", "list_bucket_tree", "create_repo"} <= {
        method for _, _, method, _, _ in calls
    }, "the scan no longer finds agrpo's Hub calls"
    for file, line, method, call, enclosing in calls:
        for keyword in call.keywords:
            where = f"{file}:{line} HfApi.{method}"
            if keyword.arg is None:  # **kwargs: must have been filtered for this line of huggingface_hub
                assert "supported_kwargs(" in enclosing, f"{where}(**...) bypasses hub_compat.supported_kwargs"
            else:
                assert accepts(getattr(HfApi, method), keyword.arg), (
                    f"{where}({keyword.arg}=) does not exist in huggingface_hub {huggingface_hub.__version__}: "
                    "send it through agrpo/hub_compat.py"
                )


@pytest.mark.parametrize("attempts", [1, 2])
def test_validation_refuses_trainer_attempts_only_where_the_hub_cannot_send_them(attempts):
    cfg = compose_run_config(
        ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", f"launcher.hf_jobs.trainer_attempts={attempts}"]
    )
    problems = hub_compat.config_problems(cfg)
    refused = attempts > 1 and HUB_MAJOR < 2
    assert bool(problems) is refused
    if refused:
        assert problems[0].startswith("launcher.hf_jobs.trainer_attempts=2 needs")
    cfg.role = "trainer"  # inside the trainer Job nothing is launched: never refused there
    assert hub_compat.config_problems(cfg) == []
