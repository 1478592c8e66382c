"""`AgrpoAsyncGRPOTrainer`: TRL's `AsyncGRPOTrainer` as agrpo runs it.

- `__init__` builds TRL's `VLLMClient` and `AsyncRolloutWorker`: replaced by `AgrpoVLLMClient` (loads wait for the
  store, serve first, feed retention: seam/client.py) and `AgrpoRolloutWorker` built with TRL's arguments (guard, drain
  on stop, the run's loop class: seam/worker.py, loop_install.py).
- `_sync_weight_lora(t0)`: with `sync.mode=background` no pause, the load on a thread (sync_mode.py,
  background_sync.py).
- `log(logs, start_time)`: figures measured outside TRL (serving, fleet) in every training log; a full disk met there
  (TensorBoard's writer) or in any thread ends the run with its paragraph only, no traceback (disk_full_quiet.py).
- `rollout_queue`: `pace_with(block)` counts what the trainer consumes, for the paced child (rollout_pacing.py).
- TRL's module `shutil.rmtree` of old versions: `retaining(retention)` defers it while a request may still need the
  folder (adapter_retention.py).
- TRL's module `create_model_from_path`: `fix_model=` (the FSDP untie, fsdp_compat.py).
(docs/architecture.md has the whole table, the worker's, the client's and the loops' rows included.)

The order of agrpo's behaviours is this class's call chain: TRL's `__init__` (with the model fix), then the client
and the worker replaced, the loop chosen; the guard, pacing, retention and background sync are each entered through a
method of this class or of its worker/client, never by replacing an attribute from outside.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

from agrpo.errors import ConfigError
from agrpo.trainer.adapter_names import AdapterNames
from agrpo.trainer.disk_full import disk_full_cause
from agrpo.trainer.disk_full_quiet import install_thread_hook, on_disk_full
from agrpo.trainer.seam.client import AgrpoVLLMClient
from agrpo.trainer.seam.module_patches import fix_loaded_model, retaining_shutil
from agrpo.trainer.seam.worker import AgrpoRolloutWorker


class AgrpoAsyncGRPOTrainer(AsyncGRPOTrainer):
    """TRL's async GRPO trainer with agrpo's client, worker, sync, log figures and pacing (see the module table)."""

    tenant: str | None = None  # a shared fleet's tenant id (set in __init__)

    def __init__(
        self,
        *args: Any,
        loop_cls: type,
        fix_model: Callable[[Any], Any] | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ):
        self.tenant = tenant  # on a shared fleet: adapters are served as `<tenant>/trl-policy-vN` (adapter_names.py)
        self.rollout_control: Any = None  # the paced child's ControlBlock while pacing (rollout_pacing.py)
        self._background: tuple[Any, float] | None = None  # (BackgroundSync or None on other ranks, timeout_s)
        self._log_figures: list[Callable[[], dict[str, float]]] = []
        self._retention: Any = None
        install_thread_hook()  # TensorBoard's writer thread meets a full disk first: no traceback on the console
        with fix_loaded_model(fix_model):
            super().__init__(*args, **kwargs)
        if self.vllm_client is not None:  # main process only
            self.vllm_client = AgrpoVLLMClient(self.vllm_client.server_url, self.vllm_client.server_timeout)
        worker = self.rollout_worker
        if isinstance(worker, AsyncRolloutWorker) and not isinstance(worker, AgrpoRolloutWorker):
            self.rollout_worker = AgrpoRolloutWorker.replacing(worker, served_lora_name=self.served_lora_name)
            self.rollout_queue = self.rollout_worker.rollout_buffer
        if self.rollout_worker is not None:
            self.rollout_worker.run_loop(loop_cls)

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
        when it would otherwise train on nothing usable (agrpo/trainer/sync_mode.py). Same (pause, barrier, transfer)
        marks, so TRL's `perf/weight_sync_s` keeps its meaning: the time a sync blocked the trainer."""
        if self._background is None:
            if self.tenant:  # TRL's sync pauses every replica and serves `_lora_name`-vN, outside the namespace
                raise ConfigError(
                    "a run on a shared fleet publishes its adapters in the background: TRL's blocking sync would pause "
                    "the other runs' generation; set sync.mode=background"
                )
            return super()._sync_weight_lora(t0)
        from agrpo.trainer.sync_mode import sync_without_pause

        sync, timeout_s = self._background
        marks = sync_without_pause(self, sync, timeout_s, t0)
        if sync is not None:  # the policy the trainer holds: staleness is measured against it
            self.model_version += 1
        return marks

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
        from agrpo.trainer.rollout_control import CountingQueue

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
