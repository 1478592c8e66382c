"""A model folder, data file or chat template on the launching machine travels to the Jobs through the bucket.

Planning is checked on plain data (which inputs, where in the bucket, what the Jobs' config and commands name);
the upload runs the real executor against the fake Hub (tests/fakes/fake_hub.py: these machines cannot reach the
Hub). The rehearsal e2e (test_rehearsal_e2e.py) runs the same path with real Jobs on this machine.
"""

import json
from pathlib import Path

import pytest
from fakes.fake_hub import FakeHub, trainer_completes, use_fake_hub
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.config.hf_jobs_checks import hf_jobs_problems
from agrpo.errors import ConfigError
from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.inputs import upload_pairs
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for

JOBS = ["launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1", "launcher.hf_jobs.namespace=alice"]
PINNED = "launcher.hf_jobs.install='agrpo==0.1.0'"  # no wheel build: these tests are about the inputs


def plan_for(*overrides, launch_id="L1"):
    return build_jobs_plan(spec_for(*JOBS, *overrides), launch_id=launch_id)


def job_config(plan):
    return OmegaConf.create(plan.config.text)


def fine_tune(folder: Path) -> Path:
    """A stand-in for a user's local fine-tune: a model folder with a nested file (only its layout matters here)."""
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "model.safetensors").write_bytes(b"\x00" * 1024)
    (folder / "sub" / "extra.txt").write_text("nested")
    return folder


def test_the_smoke_recipes_built_model_is_planned_for_a_real_launch_through_the_bucket():
    assert hf_jobs_problems(compose_run_config(["+recipe=smoke", *JOBS])) == []  # used to be refused: built here
    cfg = spec_for("+recipe=smoke", *JOBS)
    plan = build_jobs_plan(cfg, launch_id="L1")
    [model] = plan.inputs
    assert model.key == "model.name_or_path" and model.builder == "agrpo.models.tiny.build_tiny_model"
    assert model.source == str(cfg.model.name_or_path)
    assert (model.path_in_bucket, model.job_path) == ("run1/inputs/model", "/bucket/run1/inputs/model")
    assert plan.replicas[0].command[:3] == ["vllm", "serve", "/bucket/run1/inputs/model"]
    job = job_config(plan)
    assert job.model.name_or_path == "/bucket/run1/inputs/model" and job.model.builder is None
    assert str(cfg.model.name_or_path) not in plan.config.text  # nothing in the Jobs points at this machine
    assert "prepare: build " in plan.render() and "(the Jobs read /bucket/run1/inputs/model)" in plan.render()


def test_a_local_fine_tune_data_file_and_template_each_get_a_place_in_the_runs_folder(tmp_path):
    model = fine_tune(tmp_path / "my-ft")
    data = tmp_path / "task.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    plan = plan_for(
        "+recipe=gsm8k",
        f"model.name_or_path={model}",
        "data=jsonl",
        f"data.path={data}",
        f"model.chat_template={template}",
        PINNED,
    )
    where = {item.key: item.job_path for item in plan.inputs}
    assert where == {
        "model.name_or_path": "/bucket/run1/inputs/model",
        "data.path": "/bucket/run1/inputs/data/task.jsonl",
        "model.chat_template": "/bucket/run1/inputs/chat_template/chat.jinja",
    }
    job = job_config(plan)
    assert (job.model.name_or_path, job.data.path, job.model.chat_template) == tuple(where.values())
    assert str(tmp_path) not in plan.config.text and str(tmp_path) not in str(plan.jobs())
    pairs = dict((dest, src) for item in plan.inputs for src, dest in upload_pairs(item))
    assert pairs == {
        "run1/inputs/model/config.json": str(model / "config.json"),
        "run1/inputs/model/model.safetensors": str(model / "model.safetensors"),
        "run1/inputs/model/sub/extra.txt": str(model / "sub" / "extra.txt"),
        "run1/inputs/data/task.jsonl": str(data),
        "run1/inputs/chat_template/chat.jinja": str(template),
    }


def test_hub_ids_template_names_and_paths_already_on_the_bucket_stay_as_they_are():
    plan = plan_for(
        "+recipe=gsm8k",  # a Hub model (Qwen/Qwen2.5-0.5B-Instruct) and a Hub dataset
        "model.chat_template=qwen2_5",
        "data.path=/bucket/shared/train.jsonl",
        PINNED,
    )
    assert plan.inputs == []
    job = job_config(plan)
    assert job.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct" and job.data.path == "/bucket/shared/train.jsonl"
    assert job.model.chat_template == "qwen2_5"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.name_or_path=/nowhere/model", "model.name_or_path='/nowhere/model' is not a folder on this machine"),
        ("model.chat_template=/nowhere/t.jinja", "model.chat_template='/nowhere/t.jinja' does not exist"),
    ],
)
def test_a_local_input_that_is_not_there_is_refused_naming_its_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        plan_for("+recipe=gsm8k", override, PINNED)


def test_the_executor_builds_the_model_and_uploads_its_files_before_any_job(monkeypatch, tmp_path):
    """The smoke recipe against the fake Hub: the tiny model is built here (in a fresh cache) and every file of it
    lands in the bucket under the path the replicas' command names, before the first Job is created."""
    monkeypatch.setenv("AGRPO_CACHE", str(tmp_path / "cache"))
    with FakeHub(on_create=trainer_completes()) as hub:
        plan = plan_for(
            "+recipe=smoke",
            PINNED,
            "launcher.hf_jobs.poll_interval_s=0.01",
            f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
        )
        [model] = plan.inputs
        assert not Path(model.source).exists()  # planning builds nothing
        use_fake_hub(monkeypatch, hub)
        JobsRun(plan, make_api(), echo=lambda line: None).execute()
        built = Path(model.source)
        uploaded = hub.uploads["alice/agrpo-runs"]
        files = sorted(p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file())
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
        for name in files:
            assert uploaded[f"run1/inputs/model/{name}"] == (built / name).read_bytes()
        first_job = next(i for i, r in enumerate(hub.requests) if (r.method, r.path) == ("POST", "/api/jobs/alice"))
        last_upload = max(i for i, r in enumerate(hub.requests) if r.method == "PUT")
        assert last_upload < first_job


def test_a_mapping_form_tool_with_bound_options_travels_too(tmp_path, monkeypatch):
    """Issue 32: `{_target_: my_tools.py:search, limit: 5}`, the form docs/your_agent.md shows for bound options, was
    left out of the uploads (only `file.py:name` strings were), and the trainer Job failed after the replicas had
    started billing. Both forms are planned as inputs; the Job's config names the copy and keeps the option."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tools.py").write_text(
        'def search(query: str, limit: int = 3) -> str:\n    """Search.\n\n    Args:\n        query: What.\n'
        '        limit: How many.\n    """\n    return query\n'
    )
    tools = "agent.tools=[my_tools.py:search, {_target_: my_tools.py:search, limit: 5}]"
    plan = plan_for("+recipe=agent_smoke", "agent=none", tools, PINNED)
    code = {item.key: item for item in plan.inputs if "/inputs/code/" in item.job_path}
    assert set(code) == {"agent.tools.0", "agent.tools.1._target_"}
    assert code["agent.tools.1._target_"].source == str(tmp_path / "my_tools.py")
    job = job_config(plan)
    assert job.agent.tools[0].startswith("/bucket/run1/inputs/code/") and job.agent.tools[0].endswith(":search")
    assert job.agent.tools[1]._target_ == job.agent.tools[0] and job.agent.tools[1].limit == 5
    assert f"upload agent.tools.1._target_={tmp_path / 'my_tools.py'} " in plan.render()
