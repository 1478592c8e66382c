"""A run's adapter names on a shared fleet: the folder keeps `trl-policy-vN`, the served name (loads, unloads, the
rollout worker's requests) becomes `<tenant>/trl-policy-vN`; without a tenant both stay `trl-policy-vN`.

The background sync and the retention policy run for real with a recording loader; the client's unload goes to a
real HTTP server on loopback standing in for the fleet's proxy; the rollout worker is TRL's, rebuilt by agrpo's seam.
"""

from __future__ import annotations

import json
import threading

import pytest

from agrpo.fleet.tenancy import served_adapter_name, tenant_of
from agrpo.trainer.sync.names import AdapterNames, served_base
from agrpo.trainer.sync.retention import AdapterRetention
from agrpo.trainer.sync.background import BackgroundSync
from tests.http_stand_in import post_stand_in

TENANT = "t3-gsm8k-lr"


@pytest.mark.parametrize("tenant", [None, TENANT])
@pytest.mark.parametrize("version", [1, 7, 120])
def test_served_names_are_the_fleets_and_folders_keep_trls(tenant, version):
    names = AdapterNames(tenant=tenant)
    assert names.folder(version) == f"trl-policy-v{version}"  # TRL's folder name, whatever the fleet
    assert names.served(version) == served_adapter_name(tenant, version)
    assert f"{names.served_base}-v{version}" == names.served(version)  # what the rollout worker asks for
    assert tenant_of(names.served(version)) == tenant
    assert names.version_served(names.served(version)) == version


def test_a_served_name_of_another_run_or_the_base_model_is_no_version():
    mine, other = AdapterNames(tenant=TENANT), AdapterNames(tenant="t4-other")
    assert mine.version_served(other.served(3)) is None
    assert mine.version_served("trl-policy-v3") is None  # a single-run fleet's name is not this tenant's
    assert AdapterNames().version_served(mine.served(3)) is None
    assert mine.version_served(f"{TENANT}/trl-policy-v3x") is None
    assert (
        served_base("trl-policy", None) == "trl-policy" and served_base("trl-policy", TENANT) == f"{TENANT}/trl-policy"
    )


class Recorder:
    def __init__(self):
        self.events = []
        self.served = threading.Event()

    def load(self, name, path):
        self.events.append(("load", name, path))

    def unload(self, name):
        self.events.append(("unload", name))

    def delete(self, path):
        self.events.append(("delete", path))

    def on_served(self, version):
        self.events.append(("served", version))


@pytest.mark.parametrize("tenant", [None, TENANT])
def test_the_background_sync_loads_served_names_from_plain_folders(tenant):
    recorder = Recorder()
    names = AdapterNames(tenant=tenant)
    sync = BackgroundSync(
        lora_name="trl-policy",
        served_name=names.served_base,
        lora_dir="/run/.vllm_lora",
        max_staleness=0,
        load=recorder.load,
        unload=recorder.unload,
        delete=recorder.delete,
        on_served=recorder.on_served,
    )
    try:
        for version in (1, 2):
            sync.publish(version, sync.path(version))
            sync.wait_until_served(version, 10.0)
    finally:
        sync.close(drain=True, timeout_s=10.0)
    assert recorder.events == [
        ("load", names.served(1), "/run/.vllm_lora/trl-policy-v1"),
        ("served", 1),
        ("load", names.served(2), "/run/.vllm_lora/trl-policy-v2"),
        ("served", 2),
        ("unload", names.served(1)),
        ("delete", "/run/.vllm_lora/trl-policy-v1"),
    ]


EVENTS: list = []  # (path, lora_name) of each POST the stand-in proxy answered


@pytest.fixture()
def proxy_url():
    EVENTS.clear()
    with post_stand_in(lambda path, _, raw: EVENTS.append((path, json.loads(raw or b"{}").get("lora_name")))) as url:
        yield url


def test_the_clients_load_and_unload_of_a_served_name_reach_the_retention_policy(proxy_url, tmp_path):
    from agrpo.trainer.seam.client import AgrpoVLLMClient

    names = AdapterNames(tenant=TENANT)
    retention = AdapterRetention(str(tmp_path), "trl-policy", retain_s=3600.0, served_name=names.served_base)
    client = AgrpoVLLMClient(proxy_url)
    client.retain_with(retention)
    client.load_lora_adapter(names.served(2), str(tmp_path / names.folder(2)))
    client.unload_lora_adapter(names.served(1))
    client.unload_lora_adapter(AdapterNames(tenant="t9-other").served(1))  # not this run's: nothing recorded
    assert EVENTS == [
        ("/v1/load_lora_adapter", f"{TENANT}/trl-policy-v2"),
        ("/v1/unload_lora_adapter", f"{TENANT}/trl-policy-v1"),
        ("/v1/unload_lora_adapter", "t9-other/trl-policy-v1"),
    ]
    assert retention.latest_loaded == 2 and list(retention.unloaded_at) == [1]
    # the folder of v1 is deferred (unloaded just now), not deleted
    assert retention.request_delete(str(tmp_path / names.folder(1))) is True and retention.deleted == []


@pytest.mark.parametrize(("tenant", "lora_sync"), [(TENANT, True), (None, True), (TENANT, False)])
def test_the_rollout_worker_asks_for_the_served_name(tenant, lora_sync):
    from types import SimpleNamespace

    from agrpo.trainer.rollout.loop import RolloutLoop
    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker
    from agrpo.trainer.seam.trainer import AgrpoAsyncGRPOTrainer

    trainer = AgrpoAsyncGRPOTrainer.__new__(AgrpoAsyncGRPOTrainer)  # what TRL's constructor leaves, without a server
    trainer.tenant, trainer._lora_name, trainer._lora_sync = tenant, "trl-policy", lora_sync
    trainer.rollout_worker = worker = AgrpoRolloutWorker({})
    trainer.model = SimpleNamespace(config=SimpleNamespace(_name_or_path="m"))
    trainer.processing_class, trainer.eos_token_ids = None, [2]
    trainer.bind_worker()
    names = AdapterNames(tenant=tenant)
    expected = names.served_base if lora_sync else None  # no adapter sync: requests name the base model
    assert worker.settings["lora_name"] == expected and worker.settings["model_name"] == "m"
    # the loop builds each request's `model` from it, on the worker's settings
    loop = RolloutLoop.__new__(RolloutLoop)
    loop.settings = SimpleNamespace(lora_name=worker.settings["lora_name"], model_name="m")
    loop.version_value = SimpleNamespace(value=5)
    assert loop.model_now() == ((names.served(5) if lora_sync else "m"), 5)
    assert (expected == f"{TENANT}/trl-policy") is (lora_sync and tenant == TENANT)


def test_the_trainer_serves_its_namespace_and_refuses_trls_blocking_sync_on_a_fleet(monkeypatch):
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from agrpo.errors import ConfigError
    from agrpo.trainer.seam.trainer import AgrpoAsyncGRPOTrainer

    calls = []
    monkeypatch.setattr(AsyncGRPOTrainer, "_sync_weight_lora", lambda self, t0: calls.append(t0))
    trainer = AgrpoAsyncGRPOTrainer.__new__(AgrpoAsyncGRPOTrainer)
    trainer._lora_name, trainer._background, trainer.tenant = "trl-policy", None, None
    assert trainer.served_lora_name == "trl-policy"
    trainer._sync_weight_lora(1.0)
    trainer.tenant = TENANT
    assert trainer.served_lora_name == f"{TENANT}/trl-policy"
    with pytest.raises(ConfigError, match="sync.mode=background"):
        trainer._sync_weight_lora(2.0)
    assert calls == [1.0]  # TRL's sync ran only without a tenant
