"""`python -m agrpo ... launcher=hf_jobs` (role=all) checks TRL's private names before any Job is submitted.

Before issue 44 the Jobs launch left the check to the trainer Job: with a renamed name the replica Jobs were
submitted (and billed) first. Here a copy of the installed TRL with `_sync_weight_lora` renamed is first on the path
of the launching command, against the fake Hub (tests/fakes/fake_hub.py): exit 2 naming the name, and the Hub saw no
Job, no bucket and no upload.
"""

from fakes.fake_hub import FakeHub, trainer_completes

from tests.launchers.test_hf_jobs_entrypoint import child_env
from tests.trl_copy import EDITS, changed_trl, run_agrpo


def test_a_jobs_launch_on_a_changed_trl_submits_no_job(tmp_path):
    trl = changed_trl(tmp_path / "site", "sync_weight_lora")
    with FakeHub(on_create=trainer_completes("trainer: done")) as hub:
        user = [
            "+recipe=gsm8k",
            "launcher=hf_jobs",
            "sync=bucket",
            "inference.replicas=2",
            "launcher.hf_jobs.run_id=trl1",
            f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
            f"hydra.run.dir={tmp_path / 'out'}",
        ]
        result, left = run_agrpo(user, trl, cwd=tmp_path, env=child_env(hub))
    assert result.returncode == 2, result.stderr[-3000:]
    assert EDITS["sync_weight_lora"][3] in result.stderr and "Traceback" not in result.stdout + result.stderr
    assert hub.created() == [] and not hub.uploads  # nothing submitted, nothing uploaded
    assert not [call for call in hub.calls("POST", "/api/") if call.body]  # no bucket made, no Job posted
    assert left == []
