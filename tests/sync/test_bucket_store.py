"""sync=bucket: an adapter is handed to the replicas only once the bucket *lists* every file at its final size.

The Hub is faked (tests/fakes/fake_hub.py) because it cannot be reached from these machines: a local folder plays
the bucket mount, and the fake's listing can lag behind it (`hidden_polls`), as the real listing lags an upload.
"""

import pytest
from fakes.fake_hub import FakeHub, use_fake_hub

from agrpo.config.compose import compose_run_config
from agrpo.sync import get_store
from agrpo.sync.bucket import BucketStore, bucket_id, path_in_bucket
from agrpo.sync.storage import HubBucketStorage, LocalDirStorage, missing_files, wait_until_listed


def bucket_cfg(mount, *extra):
    return compose_run_config(
        [
            "+recipe=gsm8k",
            "launcher=hf_jobs",
            "sync=bucket",
            "launcher.hf_jobs.run_id=run1",
            "sync.bucket=alice/rl",
            f"sync.mount_path={mount}",
            "sync.poll_interval_s=0.01",
            *extra,
        ]
    )


def publish(mount, version, payload=b"w" * 100):
    adapter = mount / "run1" / ".vllm_lora" / f"trl-policy-v{version}"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 1}')
    (adapter / "adapter_model.safetensors").write_bytes(payload)
    return adapter


def test_waits_until_the_hub_lists_the_adapter_then_returns(tmp_path, monkeypatch):
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        hub.buckets["alice/rl"] = tmp_path
        cfg = bucket_cfg(tmp_path)
        store = get_store(cfg)
        assert isinstance(store, BucketStore) and cfg.sync.output_dir == f"{tmp_path}/run1"
        adapter = publish(tmp_path, 3)
        hub.hidden_polls["run1/.vllm_lora/trl-policy-v3/adapter_model.safetensors"] = 2
        store.wait_until_visible(str(adapter), timeout_s=10)
        assert hub.list_calls == 3  # two listings lagged, the third showed both files
        trees = [r for r in hub.requests if "/tree/" in r.path]
        assert trees[0].path == "/api/buckets/alice/rl/tree/run1%2F.vllm_lora%2Ftrl-policy-v3"
        assert ("recursive", "True") in trees[0].query or ("recursive", "true") in trees[0].query


def test_a_file_listed_at_another_size_is_still_uploading():
    expected = {"a/adapter_config.json": 10, "a/adapter_model.safetensors": 100}
    assert missing_files(expected, {"a/adapter_config.json": 10, "a/adapter_model.safetensors": 40}) == [
        "a/adapter_model.safetensors"
    ]
    assert missing_files(expected, {**expected, "a/extra": 1}) == []


def test_times_out_naming_what_is_missing(tmp_path, monkeypatch):
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        hub.buckets["alice/rl"] = tmp_path
        adapter = publish(tmp_path, 1)
        hub.hidden_polls["run1/.vllm_lora/trl-policy-v1/adapter_config.json"] = 10**6
        with pytest.raises(TimeoutError, match=r"lacks \['run1/.vllm_lora/trl-policy-v1/adapter_config.json'\]"):
            get_store(bucket_cfg(tmp_path)).wait_until_visible(str(adapter), timeout_s=0.2)


def test_an_unpublished_adapter_fails_at_once(tmp_path):
    store = BucketStore(bucket_cfg(tmp_path), storage=LocalDirStorage(tmp_path))
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        store.wait_until_visible(str(tmp_path / "run1" / ".vllm_lora" / "trl-policy-v9"), timeout_s=1)


def test_local_directory_storage_stands_in_for_the_bucket(tmp_path):
    adapter = publish(tmp_path, 2)
    store = BucketStore(bucket_cfg(tmp_path), storage=LocalDirStorage(tmp_path))
    store.wait_until_visible(str(adapter), timeout_s=1)  # a plain directory lists at once


def test_wait_until_listed_polls_on_a_fake_clock():
    listings = iter([{}, {"p/a": 1}, {"p/a": 1, "p/b": 2}])

    class Storage(LocalDirStorage):
        def list_files(self, prefix=""):
            return next(listings)

    now = [0.0]
    polls = wait_until_listed(
        Storage("/"),
        "p",
        {"p/a": 1, "p/b": 2},
        5.0,
        0.25,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert (polls, now[0]) == (3, 0.5)


def test_hub_storage_lists_relative_to_its_root(tmp_path, monkeypatch):
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        hub.buckets["alice/rl"] = tmp_path
        publish(tmp_path, 5, payload=b"abc")
        from agrpo.launchers.hf_jobs.client import make_api

        storage = HubBucketStorage(make_api(), "alice/rl", "run1", tmp_path / "run1")
        assert storage.list_files(".vllm_lora") == {
            ".vllm_lora/trl-policy-v5/adapter_config.json": 8,
            ".vllm_lora/trl-policy-v5/adapter_model.safetensors": 3,
        }
        storage.write_text("notes/x.txt", "hi")  # contents go through the mount
        assert (tmp_path / "run1" / "notes" / "x.txt").read_text() == "hi"


def test_bucket_ids_and_paths():
    cfg = bucket_cfg("/bucket", "sync.bucket=rl")
    assert bucket_id(cfg.sync, "alice") == "alice/rl" and bucket_id(cfg.sync, None) == "rl"
    assert path_in_bucket("/bucket/run1/.vllm_lora/v1", "/bucket") == "run1/.vllm_lora/v1"
    assert path_in_bucket("/bucket", "/bucket") == ""
    with pytest.raises(ValueError, match="not under the bucket mount"):
        path_in_bucket("/tmp/run1", "/bucket")
