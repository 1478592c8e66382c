"""`AgrpoAsyncGRPOTrainer`: TRL's `AsyncGRPOTrainer` as agrpo runs it.

- `rollout_worker=`: agrpo's own worker (agrpo/trainer/rollout/worker.py) through TRL's public hook; TRL builds none.
  TRL derives some of the loop's arguments while it builds itself: `__init__` then hands them to the worker (`bind`).
- `VLLMClient`: TRL's trainer module builds its client by name; for the span of TRL's `__init__` that name is
  `AgrpoVLLMClient` (loads wait for the store, serve first, feed retention: seam/client.py), so no client is built to
  be thrown away.
- `_sync_weight_lora(t0)`: with `sync.mode=background` no pause, the load on a thread (the logic: `_publish_without_pause`
  here; the thread: sync/background.py).
- `_save_checkpoint` / `train`: TRL saves and restores the rollout position (rollout_state.json) for its own worker
  only; agrpo's worker gets the same.
- `log(logs, start_time)`: figures measured outside TRL (serving, fleet) in every training log; a full disk met there
  (TensorBoard's writer) or in any thread ends the run with its paragraph only, no traceback (disk_full_quiet.py).
- `rollout_queue`: `pace_with(block)` counts what the trainer consumes, for the paced child (rollout/pacing.py).
- TRL's module `shutil.rmtree` of old versions: `retaining(retention)` defers it while a request may still need the
  folder (sync/retention.py).
- TRL's module `create_model_from_path`: `fix_model=` (the FSDP untie, seam/fsdp_compat.py).
(docs/architecture.md has the whole table.)

Every TRL private name read here is listed in agrpo/trl_compat.py; no module outside agrpo/trainer/seam reads one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.trainer.utils import get_config_model_id

from agrpo.errors import ConfigError
from agrpo.sync.resume import ROLLOUT_STATE
from agrpo.trainer.sync.names import AdapterNames
from agrpo.trainer.sync.snapshot import snapshot_adapter
from agrpo.trainer.sync.background import version_needed
from agrpo.trainer.disk_full import disk_full_cause
from agrpo.trainer.disk_full_quiet import install_thread_hook, on_disk_full
from agrpo.trainer.rollout.pacing import note_published
from agrpo.trainer.seam.client import AgrpoVLLMClient
from agrpo.trainer.seam.module_patches import building_client, fix_loaded_model, retaining_shutil

CHECKPOINT_PREFIX = "checkpoint"  # transformers' PREFIX_CHECKPOINT_DIR


class AgrpoAsyncGRPOTrainer(AsyncGRPOTrainer):
    """TRL's async GRPO trainer with agrpo's client, worker, sync, log figures and pacing (see the module table)."""

    tenant: str | None = None  # a shared fleet's tenant id (set in __init__)

    def __init__(
        self,
        *args: Any,
        rollout_worker: Any,
        fix_model: Callable[[Any], Any] | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ):
        """TRL's constructor, with agrpo's rollout worker (TRL's public hook) and client; what TRL derives as it builds
        itself (model id, adapter sync, tokenizer, EOS ids) is then handed to the worker."""
        self.tenant = tenant  # on a shared fleet: adapters are served as `<tenant>/trl-policy-vN` (sync/names.py)
        self.rollout_control: Any = None  # the paced child's ControlBlock while pacing (rollout/pacing.py)
        self._background: tuple[Any, float] | None = None  # (BackgroundSync or None on other ranks, timeout_s)
        self._log_figures: list[Callable[[], dict[str, float]]] = []
        self._retention: Any = None
        install_thread_hook()  # TensorBoard's writer thread meets a full disk first: no traceback on the console
        with fix_loaded_model(fix_model), building_client(AgrpoVLLMClient):
            super().__init__(*args, rollout_worker=rollout_worker, **kwargs)
        self.bind_worker()

    def bind_worker(self) -> None:
        """Hand the worker what TRL derived while it built itself (main process; other ranks have no worker): the
        model id, the name requests ask for (`<served_lora_name>-vN` with adapter sync, else the base model), the
        tokenizer TRL loaded and its EOS ids."""
        if self.rollout_worker is not None:
            self.rollout_worker.bind(
                model_name=get_config_model_id(self.model.config),
                lora_name=self.served_lora_name if self._lora_sync else None,
                processing_class=self.processing_class,
                eos_token_ids=list(self.eos_token_ids),
            )

    # ---- the rollout position in checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL writes rollout_state.json (the next prompt, the adapter version) into each checkpoint for its own
        worker only (an `isinstance` check). agrpo writes the same file for its worker, before transformers' save
        (whose trainer_state.json, written last, marks a checkpoint complete: agrpo/sync/resume.py)."""
        if self.accelerator.is_main_process and self.rollout_worker is not None:
            folder = os.path.join(self.args.output_dir, f"{CHECKPOINT_PREFIX}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            untrained = next(g for g in range(len(self._trained_groups) + 1) if g not in self._trained_groups)
            state = {"prompt_index": self.rollout_worker.start_index + untrained, "model_version": self.model_version}
            with open(os.path.join(folder, ROLLOUT_STATE), "w") as handle:
                json.dump(state, handle)
        super()._save_checkpoint(model, trial)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """TRL restores the rollout position from rollout_state.json for its own worker only. agrpo: the same for its
        worker (the first prompt group, the groups already trained for the epoch stop, the adapter version)."""
        self._groups_before_resume = 0
        if self.rollout_worker is not None:
            self.rollout_worker.start_index = 0
            state_file = os.path.join(str(resume_from_checkpoint), ROLLOUT_STATE)
            if resume_from_checkpoint is not None and os.path.isfile(state_file):
                with open(state_file) as handle:
                    state = json.load(handle)  # read and checked by agrpo/sync/resume.py before the trainer starts
                self.rollout_worker.start_index = self._groups_before_resume = int(state["prompt_index"])
                self.model_version = int(state.get("model_version", 0))
                self.rollout_worker.update_model_version(self.model_version)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # ---- the adapter sync
    @property
    def served_lora_name(self) -> str:
        """TRL's `_lora_name` names both the folder and the served adapter; agrpo serves `served_lora_name`-vN (the
        run's namespace on a shared fleet) and keeps the folder `_lora_name`-vN."""
        return AdapterNames(self._lora_name, self.tenant).served_base

    def sync_in_background(self, sync: Any, timeout_s: float) -> None:
        """From now on `_sync_weight_lora` hands each version to `sync` (a BackgroundSync; None on the ranks that
        only take part in the collective snapshot)."""
        self._background = (sync, timeout_s)

    def _sync_weight_lora(self, t0: float) -> tuple[float, float, float]:
        """TRL pauses every replica, saves the adapter, loads it on every replica, resumes them, unloads and deletes
        old versions, and only then trains on. With `sync.mode=background` (after `sync_in_background`): the adapter
        is snapshotted and handed to the background thread, which writes, loads and serves it; the trainer waits only
        when it would otherwise train on nothing usable (agrpo/trainer/sync/mode.py). Same (pause, barrier, transfer)
        marks, so TRL's `perf/weight_sync_s` keeps its meaning: the time a sync blocked the trainer."""
        if self._background is None:
            if self.tenant:  # TRL's sync pauses every replica and serves `_lora_name`-vN, outside the namespace
                raise ConfigError(
                    "a run on a shared fleet publishes its adapters in the background: TRL's blocking sync would pause "
                    "the other runs' generation; set sync.mode=background"
                )
            return super()._sync_weight_lora(t0)
        sync, timeout_s = self._background
        marks = self._publish_without_pause(sync, timeout_s, t0)
        if sync is not None:  # the policy the trainer holds: staleness is measured against it
            self.model_version += 1
        return marks

    def _publish_without_pause(self, sync: Any, timeout_s: float, t0: float) -> tuple[float, float, float]:
        """TRL's (pause, barrier, transfer) marks for a sync that pauses nothing: every rank snapshots the adapter (a
        collective under FSDP; `sync` is None on the other ranks), the thread writes, loads and serves it; the trainer
        waits only when it would otherwise train on nothing usable (sync/background.py: `version_needed`)."""
        version = self.model_version + 1
        adapter_dir = os.path.join(self._lora_dir, f"{self._lora_name}-v{version}")
        model = self.accelerator.unwrap_model(self.model)
        t_pause = time.time()  # nothing is paused
        self.accelerator.wait_for_everyone()
        t_barrier = time.time()
        snapshot = snapshot_adapter(model, self.accelerator, self._adapter_name)
        if sync is not None:
            needed = version_needed(version, sync.state.served, self.args.max_staleness)
            note_published(self, version)
            sync.publish(version, adapter_dir, snapshot.write)
            waited = sync.wait_until_served(needed, timeout_s)
            self.record("sync/wait_for_served_s", waited)
        return t_pause, t_barrier, time.time()

    def record(self, key: str, value: float) -> None:
        """One figure into TRL's training metrics (logged with the step's, then cleared by TRL)."""
        self._metrics["train"][key].append(value)

    @property
    def adapter_folders(self) -> tuple[str, str]:
        """(the folder TRL publishes versions under, their base name): `<output_dir>/.vllm_lora`, `trl-policy`."""
        return self._lora_dir, self._lora_name

    @contextlib.contextmanager
    def retaining(self, retention: Any) -> Iterator[None]:
        """While training: loads and unloads are reported to `retention` (an AdapterRetention), and every deletion of
        a published version's folder, TRL's blocking sync's or the background thread's (`delete_published`), is
        deferred by it."""
        client = self.vllm_client
        if isinstance(client, AgrpoVLLMClient):
            client.retain_with(retention)
        self._retention = retention
        try:
            with retaining_shutil(retention):
                yield
        finally:
            self._retention = None
            if isinstance(client, AgrpoVLLMClient):
                client.retain_with(None)

    def delete_published(self, path: str) -> None:
        """Delete a published version's folder as TRL does, through the retention policy while one is active."""
        if self._retention is None or not self._retention.request_delete(path):
            shutil.rmtree(path, ignore_errors=True)

    # ---- pacing
    def pace_with(self, block: Any) -> None:
        """Pace the rollout child with `block` (a ControlBlock; None when pacing ends): its paced loop gets the block
        and what the trainer takes off the rollout queue is counted into it."""
        from agrpo.trainer.rollout.control import CountingQueue

        if block is not None:
            self.rollout_worker.pace(block.path, self.args.max_staleness)
            self.rollout_queue = CountingQueue(self.rollout_queue, block)
        self.rollout_control = block

    # ---- logs
    def add_log_figures(self, figures: Callable[[], dict[str, float]]) -> None:
        """`figures()` is added to every training log (not to the end-of-training summary, which is TRL's)."""
        self._log_figures.append(figures)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL drains the rollout child's metrics into its own and logs them. agrpo first adds the figures measured
        outside TRL (`add_log_figures`: the replicas' serving figures, the fleet's size), so they reach TensorBoard,
        log_history and metrics.json with the step's."""
        if "train_runtime" not in logs:
            for figures in self._log_figures:
                logs.update(figures())
        try:
            super().log(logs, start_time)
        except Exception as error:
            if disk_full_cause(error) is not None:  # the trainer ends with the paragraph (agrpo/trainer/__main__.py)
                on_disk_full(error, "main")
            raise
