"""agrpo's rollout worker, handed to TRL as `AsyncGRPOTrainer(rollout_worker=...)`: TRL's public
`RolloutWorkerProtocol` (`rollout_buffer`, `metrics_queue`, `start`, `stop`, `update_model_version`, `check_health`),
documented by TRL for plugging in a rollout backend. It subclasses nothing of TRL's and is composed of parts with one
concern each:

- the child-process lifecycle: `ChildChannels` and `ChildProcess` (process.py), the child's entry (entry.py);
- the guard: failures, deaths and hangs become one paragraph and end the run (guard.py);
- the loop the child runs (loop.py, agrpo's own: no TRL class) and its settings, `loop_arguments` here;
- request pacing and the in-flight budget: `pace(control, max_staleness)` hands the loop its control block
  (pacing.py, control.py; the loop's side is admission.py).

TRL derives a few of the loop's arguments inside its own `__init__` (the model id, whether adapters are synced, the
tokenizer it loaded, its EOS ids); `AgrpoAsyncGRPOTrainer` (agrpo/trainer/seam/trainer.py) hands them over with
`bind` once TRL built itself, before anything starts the worker. Where TRL's own worker would have been built, none is.
"""

from __future__ import annotations

import logging
import pickle
import threading
from typing import Any

from agrpo.trainer.rollout.entry import ChildEntry
from agrpo.trainer.rollout.guard import RolloutGuard
from agrpo.trainer.rollout.process import ChildChannels, ChildProcess

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # the spawned child imports torch, transformers and TRL before it is ready
STOP_SIGNAL_WAIT_S = 5.0


def loop_arguments(args: Any, dataset: Any, reward_funcs: list[Any], tools: Any, environment_factory: Any) -> dict:
    """The loop's settings that come from the run (loop.py's `LoopSettings`): TRL's config (`AsyncGRPOConfig`) and the
    trainer's inputs. The ones TRL derives while it builds itself come later (`AgrpoRolloutWorker.bind`)."""
    return dict(
        dataset=dataset,
        reward_funcs=list(reward_funcs or []),
        tools=tools,
        environment_factory=environment_factory,
        num_generations=args.num_generations,
        max_inflight_tasks=args.max_inflight_tasks,
        queue_maxsize=args.queue_maxsize,
        vllm_server_url=args.vllm_server_base_url,
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        request_timeout=args.request_timeout,
        chat_template_kwargs=args.chat_template_kwargs,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        log_completions=args.log_completions,
        num_completions_to_print=args.num_completions_to_print,
        fork_threshold_tokens=args.fork_threshold_tokens,
    )


class AgrpoRolloutWorker:
    """TRL's `RolloutWorkerProtocol`, agrpo's way (the module docstring has its parts)."""

    def __init__(self, loop_settings: dict[str, Any], queue_maxsize: int = 0, ready_timeout_s: float = READY_TIMEOUT_S):
        self.settings = loop_settings  # the loop's (loop.py's LoopSettings, by name); every value picklable
        self.child = ChildProcess()
        self.channels = ChildChannels.create(self.child.context, queue_maxsize)
        self.ready_timeout_s = ready_timeout_s
        self.start_index = 0  # the dataset row the first group starts at (a resumed run's saved position)
        self.guard = RolloutGuard(self, lambda: (0, 0), run_dir=None, level="INFO", log_file=None)

    # ---- TRL's protocol
    @property
    def rollout_buffer(self) -> Any:
        return self.channels.samples

    @property
    def metrics_queue(self) -> Any:
        return self.channels.metrics

    def update_model_version(self, model_version: int) -> None:
        """The version the trainer now serves: the child's next requests name it, its samples carry it."""
        self.channels.set_version(model_version)

    def start(self) -> None:
        """Spawn the child and wait until its loop is built; a child that fails first is its own paragraph (a chat
        template TRL does not recognise, say: guard.py)."""
        if self.child.process is not None:
            log.warning("the rollout worker is already running; start() ignored")
            return
        settings = {**self.settings, "dataset_start_index": self.start_index}
        _check_picklable(settings)
        entry = ChildEntry(self.guard.run_dir, self.guard.level)
        self.child.spawn(entry, (settings, self.channels), self.channels, self.ready_timeout_s, self.guard.exited)

    def check_health(self, stale_after_s: float) -> None:
        """A failure, a death or a heartbeat older than `stale_after_s` is `RolloutFailed`, one paragraph with the
        step (guard.py)."""
        self.guard.check(stale_after_s)

    def stop(self) -> None:
        """A failed or hung child is killed at once; a living one is signalled (from a thread waited on for a
        bounded time: a child that died asleep on the event makes `set()` wait forever, CPython #75158) and waited
        for while the queues are drained, so it exits by itself."""
        if self.child.process is None:
            return
        if self.guard.failure is not None and self.child.process.is_alive():
            self.child.process.kill()
        elif self.child.process.is_alive():
            setter = threading.Thread(target=self.channels.stop.set, daemon=True, name="agrpo-stop-rollouts")
            setter.start()
            setter.join(STOP_SIGNAL_WAIT_S)
        self.child.join(self.channels)

    # ---- what agrpo adds
    def bind(self, *, model_name: str, lora_name: str | None, processing_class: Any, eos_token_ids: list[int]) -> None:
        """The loop's arguments TRL derives while it builds itself; `lora_name` None: requests name the base model
        (full-weight sync), else `<lora_name>-vN` (`<tenant>/trl-policy` on a shared fleet: adapter_names.py)."""
        self.settings.update(
            model_name=model_name, lora_name=lora_name, processing_class=processing_class, eos_token_ids=eos_token_ids
        )

    def watch(self, guard: RolloutGuard) -> None:
        """Guard the run (guard.py): its progress for the paragraphs, its run dir for the child's log."""
        self.guard = guard

    def pace(self, control_path: str, max_staleness: int) -> None:
        """Hand the loop the control block it is paced with (admission.py reads it)."""
        self.settings.update(agrpo_control=control_path, agrpo_max_staleness=max_staleness)

    def unpace(self) -> None:
        for key in ("agrpo_control", "agrpo_max_staleness"):
            self.settings.pop(key, None)


def _check_picklable(kwargs: dict[str, Any]) -> None:
    """The child is spawned: every argument travels pickled. A lambda or a closure among the rewards, tools or the
    environment factory fails here with what to do, not inside multiprocessing."""
    try:
        pickle.dumps(kwargs)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(
            f"the rollout worker runs in a spawned process, so its rewards, tools and environment factory must be "
            f"picklable ({error}): use module-level functions, functools.partial or instances of module-level classes, "
            "never lambdas or closures"
        ) from error
