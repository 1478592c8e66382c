"""The rehearsal stand-in with real processes, namespaces and HTTP, driven through huggingface_hub's own HfApi (the
calls the launcher makes). The Jobs here are small Python programs, not vLLM: the end-to-end rehearsal with vLLM
is test_rehearsal_e2e.py. Needs root (mount and network namespaces), as a rehearsal does."""

import json
import time

import pytest
import requests
from hub_lines import needs_run_job_attempts

from agrpo.rehearsal.rehearse import rehearsal
from agrpo.rehearsal.runner import marked_pids, namespaces_available

pytestmark = pytest.mark.requires(namespaces_available())  # no root or namespaces: fail saying so, never skip
NS = "alice"
# A Job that serves GET (its own marker) and POST (200 {"loaded": true}) on 0.0.0.0:8000, like a replica.
SERVE = (
    "import http.server, json, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def _ok(self, body):\n"
    "        data = json.dumps(body).encode(); self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)\n"
    "    def do_GET(self): self._ok({'job': os.environ['AGRPO_REHEARSAL_JOB'], 'path': self.path})\n"
    "    def do_POST(self):\n"
    "        self.rfile.read(int(self.headers['Content-Length'])); self._ok({'loaded': True})\n"
    "print('serving', flush=True)\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
)


# The stand-in bucket's listing lag and negative-lookup cache: the cache is long beside the lag, so that a check made
# once the listing shows a file falls inside the cache however slow the machine is.
LAG_S, NEGATIVE_CACHE_S = 1.0, 10.0


def wait_until(predicate, timeout_s=30.0, what="the event"):
    """Poll `predicate` until it holds (bounded); return the seconds waited."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start >= timeout_s:  # a bounded wait, not a speed check
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


def wait_stage(api, job_id, stages, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = api.inspect_job(job_id=job_id, namespace=NS)
        if info.status.stage in stages:
            return info
        time.sleep(0.3)
    raise AssertionError(f"Job {job_id} never reached {stages}: {info.status}")


def wait_serving(url, token, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reply = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
            if reply.status_code == 200:
                return reply.json()
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} never served")


@pytest.fixture
def stand_in(tmp_path):
    with rehearsal(NS, lag_s=LAG_S, negative_cache_s=NEGATIVE_CACHE_S, root=str(tmp_path / "rehearsal")) as running:
        yield running
    assert marked_pids(set(running.stand_in.jobs)) == []  # every Job's processes are gone


def test_two_replicas_on_the_same_port_are_reached_through_the_gateway_with_the_token(stand_in, tmp_path):
    from huggingface_hub import Volume

    api, token = stand_in.api(), stand_in.stand_in.token
    api.create_bucket(f"{NS}/b", private=True, exist_ok=True)  # mounting a bucket that does not exist is refused
    volume = Volume(type="bucket", source=f"{NS}/b", mount_path=str(tmp_path / "mnt"), read_only=True)
    replicas = [
        api.run_job(
            image="img",
            command=["python3", "-c", SERVE],
            secrets={"HF_TOKEN": token},
            labels={"agrpo-run": "r1", "i": str(i)},
            expose=[8000],
            volumes=[volume],
            namespace=NS,
        )
        for i in range(2)
    ]
    for job in replicas:
        url = f"http://{job.id}--8000.hf.jobs:{stand_in.gateway_port}"
        assert wait_serving(stand_in.reach(url) + "/health", token) == {"job": job.id, "path": "/health"}
        assert requests.get(stand_in.reach(url) + "/health", timeout=5).status_code == 401  # no token, no answer
        assert wait_stage(api, job.id, ["RUNNING"]).status.expose_urls == [url]
    # a Job resolves the exposed names through its own /etc/hosts, with curl as any image would
    curl = api.run_job(
        image="img",
        command=[
            "bash",
            "-c",
            'for id in "$@"; do curl -sf -H "Authorization: Bearer '
            f'$HF_TOKEN" http://$id--8000.hf.jobs:{stand_in.gateway_port}/v1/x; '
            "echo; done",
            "curl",
            *[job.id for job in replicas],
        ],
        secrets={"HF_TOKEN": token},
        labels={"agrpo-run": "r1"},
        namespace=NS,
    )
    assert wait_stage(api, curl.id, ["COMPLETED", "ERROR"]).status.stage == "COMPLETED"
    lines = [json.loads(line) for line in api.fetch_job_logs(job_id=curl.id, namespace=NS) if line.strip()]
    assert lines == [{"job": job.id, "path": "/v1/x"} for job in replicas]
    assert {j.id for j in api.list_jobs(labels={"agrpo-run": "r1", "i": "1"}, namespace=NS)} == {replicas[1].id}
    api.cancel_job(job_id=replicas[0].id, namespace=NS)
    info = wait_stage(api, replicas[0].id, ["CANCELED"])
    assert info.status.message == "canceled by user"
    assert marked_pids({replicas[0].id}) == [] and marked_pids({replicas[1].id}) != []


def test_a_job_reaches_a_replica_job_created_after_it_started(stand_in):
    """A trainer Job that launches replica Jobs (inference.replicas=auto) resolves their exposed names, as the Hub's DNS
    would: the stand-in names every new exposed port in the hosts file of each running Job."""
    api, token = stand_in.api(), stand_in.stand_in.token
    port = stand_in.gateway_port
    probe = (
        "while [ ! -f target ]; do sleep 0.2; done; id=$(cat target); "
        "for i in $(seq 300); do "
        f'curl -sf -H "Authorization: Bearer $HF_TOKEN" http://$id--8000.hf.jobs:{port}/late && exit 0; '
        "sleep 0.2; done; exit 1"
    )
    trainer = api.run_job(image="img", command=["bash", "-c", probe], secrets={"HF_TOKEN": token}, namespace=NS)
    wait_stage(api, trainer.id, ["RUNNING"])
    late = api.run_job(
        image="img", command=["python3", "-c", SERVE], secrets={"HF_TOKEN": token}, expose=[8000], namespace=NS
    )
    (stand_in.stand_in.root / "jobs" / trainer.id / "home" / "target").write_text(late.id)
    assert wait_stage(api, trainer.id, ["COMPLETED", "ERROR"], timeout_s=90).status.stage == "COMPLETED"
    lines = [json.loads(line) for line in api.fetch_job_logs(job_id=trainer.id, namespace=NS) if line.strip()]
    assert lines == [{"job": late.id, "path": "/late"}]


def test_the_bucket_is_mounted_read_only_or_read_write_and_listed_after_the_lag(stand_in, tmp_path):
    from huggingface_hub import Volume

    api, mount = stand_in.api(), str(tmp_path / "mnt")
    api.create_bucket(f"{NS}/b", private=True, exist_ok=True)
    api.batch_bucket_files(f"{NS}/b", add=[(b"cfg\n", "run/config.yaml")])
    write = "cat $0/run/config.yaml && echo v1 > $0/run/adapter && echo written"
    writer = api.run_job(
        image="img",
        command=["bash", "-c", write, mount],
        namespace=NS,
        volumes=[Volume(type="bucket", source=f"{NS}/b", mount_path=mount)],
    )
    reader = api.run_job(
        image="img",
        command=["bash", "-c", "echo x > $0/run/other", mount],
        namespace=NS,
        volumes=[Volume(type="bucket", source=f"{NS}/b", mount_path=mount, read_only=True)],
    )
    assert wait_stage(api, writer.id, ["COMPLETED", "ERROR"]).status.stage == "COMPLETED"
    assert list(api.fetch_job_logs(job_id=writer.id, namespace=NS)) == ["cfg", "written"]
    assert wait_stage(api, reader.id, ["COMPLETED", "ERROR"]).status.message == "exit code 1"  # read-only mount
    bucket = stand_in.stand_in.bucket_dir(f"{NS}/b")
    assert (bucket / "run/adapter").read_text() == "v1\n" and not (bucket / "run/other").exists()
    assert not (tmp_path / "mnt").exists() or not any((tmp_path / "mnt").iterdir())  # the mount was the Job's own
    (bucket / "run/late").write_text("x")  # as a trainer writes through its mount

    def listed():
        return {f.path for f in api.list_bucket_tree(f"{NS}/b", recursive=True)}

    assert "run/config.yaml" in listed() and "run/late" not in listed()  # within the lag: not listed yet
    wait_until(lambda: "run/late" in listed(), what="listing of run/late")  # then it is


def test_a_load_asked_too_early_is_refused_until_the_negative_cache_expires(stand_in, tmp_path):
    from huggingface_hub import Volume

    api, token, mount = stand_in.api(), stand_in.stand_in.token, str(tmp_path / "mnt")
    api.create_bucket(f"{NS}/b", private=True, exist_ok=True)
    job = api.run_job(
        image="img",
        command=["python3", "-c", SERVE],
        secrets={"HF_TOKEN": token},
        expose=[8000],
        volumes=[Volume(type="bucket", source=f"{NS}/b", mount_path=mount, read_only=True)],
        namespace=NS,
    )
    url = stand_in.reach(f"http://{job.id}--8000.hf.jobs:{stand_in.gateway_port}")
    wait_serving(url + "/health", token)

    def load(version):
        body = {"lora_name": version, "lora_path": f"{mount}/run/{version}"}
        return requests.post(
            url + "/v1/load_lora_adapter", json=body, timeout=10, headers={"Authorization": f"Bearer {token}"}
        )

    bucket = stand_in.stand_in.bucket_dir(f"{NS}/b")

    def write_adapter(version):
        """The adapter's config (what a load looks up) and a file beside it that nothing looks up: once that one is
        listed, the listing lag is over for both, and only a cached miss can still hide the config."""
        (bucket / f"run/{version}").mkdir(parents=True)
        for name in ("adapter_config.json", "beside"):
            (bucket / f"run/{version}/{name}").write_text("{}")

    def listed(path):
        return path in {f.path for f in api.list_bucket_tree(f"{NS}/b", recursive=True)}

    early_at = time.monotonic()
    early = load("v1")  # asked before the adapter exists: vLLM's 404, and the miss is cached
    assert early.status_code == 404 and "No adapter found" in early.text
    write_adapter("v1")
    wait_until(lambda: listed("run/v1/beside"), what="listing of v1")  # past the listing lag...
    assert load("v1").status_code == 404  # ...but the miss is still cached
    wait_until(lambda: load("v1").status_code == 200, timeout_s=NEGATIVE_CACHE_S + 30, what="load of v1")
    assert time.monotonic() - early_at >= NEGATIVE_CACHE_S  # not before the cache expired
    write_adapter("v2")
    wait_until(lambda: listed("run/v2/beside"), what="listing of v2")  # waited for the lag, as the visibility gate does
    assert load("v2").status_code == 200  # no miss was cached: it loads at once


@needs_run_job_attempts
def test_timeout_preemption_and_requeue_end_jobs_as_the_service_does(stand_in):
    api = stand_in.api()
    slow = api.run_job(image="img", command=["sleep", "60"], timeout=2, namespace=NS)
    assert wait_stage(api, slow.id, ["ERROR", "COMPLETED"]).status.message == "Job timeout after 2 s"
    failing = api.run_job(image="img", command=["bash", "-c", "echo run; exit 3"], attempts=2, namespace=NS)
    info = wait_stage(api, failing.id, ["ERROR"])
    while stand_in.stand_in.jobs[failing.id].attempt < 2 or info.status.stage not in ("ERROR", "COMPLETED"):
        time.sleep(0.3)
        info = api.inspect_job(job_id=failing.id, namespace=NS)
    assert info.status.message == "exit code 3"
    assert stand_in.stand_in.jobs[failing.id].history.count("RUNNING") == 2  # requeued once, then it stayed over
    marker = "preempted-once"
    resumed = api.run_job(
        image="img",
        command=["bash", "-c", f"test -f {marker} && echo resumed && exit 0; touch {marker}; sleep 60"],
        attempts=2,
        namespace=NS,
    )
    wait_stage(api, resumed.id, ["RUNNING"])
    home = stand_in.stand_in.root / "jobs" / resumed.id / "home"  # the Job's working directory
    wait_until(lambda: (home / marker).exists(), what="the first attempt's marker")
    stand_in.stand_in.preempt(resumed.id)
    final = wait_stage(api, resumed.id, ["COMPLETED"], timeout_s=90)
    assert stand_in.stand_in.jobs[resumed.id].history[:4] == ["SCHEDULING", "RUNNING", "ERROR", "SCHEDULING"]
    assert final.status.stage == "COMPLETED" and "resumed" in list(api.fetch_job_logs(job_id=resumed.id, namespace=NS))


@needs_run_job_attempts
def test_the_preemption_knob_kills_the_trainers_first_attempt_and_the_requeue_finishes(tmp_path):
    with rehearsal(NS, 1.0, 30.0, str(tmp_path / "r"), preempt_trainer_after_s=1.0) as running:
        api = running.api()
        command = ["bash", "-c", "test -f attempt1 && echo resumed && exit 0; touch attempt1; sleep 60"]
        trainer = api.run_job(image="img", command=command, attempts=2, labels={"agrpo-role": "trainer"}, namespace=NS)
        final = wait_stage(api, trainer.id, ["COMPLETED"], timeout_s=90)
        record = running.stand_in.jobs[trainer.id]
    assert final.status.stage == "COMPLETED" and record.attempt == 2
    assert record.history == ["SCHEDULING", "RUNNING", "ERROR", "SCHEDULING", "RUNNING", "COMPLETED"]
    summary = json.loads((tmp_path / "r" / "jobs.json").read_text())
    assert summary["jobs"][trainer.id]["history"] == record.history and summary["killed_after_end"] == []


def test_the_stand_in_is_handed_to_the_caller_not_put_in_the_environment(tmp_path, monkeypatch):
    """The executor is given the stand-in's API and token; this process's HF_TOKEN and HF_ENDPOINT stay as they are
    (a real token never becomes the rehearsal's, nor the rehearsal's a leftover after it)."""
    import os

    monkeypatch.setenv("HF_TOKEN", "hf_users_own_token")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    with rehearsal(NS, 1.0, 3.0, str(tmp_path / "r")) as running:
        assert os.environ["HF_TOKEN"] == "hf_users_own_token" and "HF_ENDPOINT" not in os.environ
        assert running.token.startswith("hf_rehearsal_") and running.token != "hf_users_own_token"
        assert running.api().whoami()["name"] == NS
    assert os.environ["HF_TOKEN"] == "hf_users_own_token" and "HF_ENDPOINT" not in os.environ
