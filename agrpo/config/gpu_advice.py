"""The GPU plan's verdict with advice that is known to work (pure; issue 45).

A refusal used to name knobs whose use could still fail: "set inference.gpus and trainer.gpus" for two replicas on
one GPU led to a plan that ran out of memory. Here each piece of advice is a set of overrides, and it is offered only
when the planner (agrpo/config/gpu_plan.py), run again on the config with those overrides, accepts it. Candidates, in
order: fewer replica slots (naming inference.max_replicas for an auto fleet), the replicas sharing GPUs at a fraction
that fits, and for the trainer gradient checkpointing, a smaller trainer.token_budget, both, or a smaller replica
share; at most MAX_ADVICE sets are shown.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import OmegaConf

from agrpo.config.gpu_plan import fleet_slots, needs_of, plan_problems, replica_key, replicas_start_here

MAX_ADVICE = 4
FRACTIONS = tuple(round(0.05 * step, 2) for step in range(19, 0, -1))  # 0.95 .. 0.05, the largest that fits first


@dataclass(frozen=True)
class Machine:
    count: int  # GPUs this run may use
    memory: float  # bytes of each
    name: str
    bf16: bool = True


@dataclass(frozen=True)
class Verdict:
    problems: list[str]
    advice: list[tuple[str, ...]] = field(default_factory=list)  # override sets, each accepted by the planner

    def text(self) -> str:
        if not self.problems:
            return ""
        shown = "; ".join(self.problems)
        if not self.advice:
            return f"the GPU plan does not fit: {shown}. No setting of this run fits this machine: use larger GPUs"
        options = "; or ".join(f"`{' '.join(overrides)}`" for overrides in self.advice)
        return f"the GPU plan does not fit: {shown}. Each of these fits (by agrpo's estimates): {options}"


class View(dict):
    """The few sections the planner reads, as plain nested dicts read by attribute: trying ~60 override sets on it
    costs milliseconds, where merging each into the whole composed config took ~30 ms."""

    def __getattr__(self, key: str) -> Any:
        try:
            value = self[key]
        except KeyError as error:
            raise AttributeError(key) from error
        return View(value) if isinstance(value, dict) else value


PLANNED = ("inference", "trainer", "model", "lora", "launcher")


def plan_view(cfg: Any) -> View:
    if isinstance(cfg, View):
        return cfg
    view = View({key: OmegaConf.to_container(cfg[key], resolve=True) for key in PLANNED})
    view["role"] = cfg.role
    return view


def with_overrides(cfg: Any, overrides: tuple[str, ...]) -> View:
    """`cfg` with dotted `key=value` overrides applied (values read as YAML, as on the command line)."""
    view = View(copy.deepcopy(dict(plan_view(cfg))))
    for override in overrides:
        key, _, text = override.partition("=")
        *parents, leaf = key.split(".")
        section = view
        for parent in parents:
            section = section[parent]
        section[leaf] = yaml.safe_load(text)
    return view


def problems_of(cfg: Any, machine: Machine, model_config: dict[str, Any] | None) -> list[str]:
    return plan_problems(cfg, machine.count, machine.memory, machine.name, needs_of(cfg, model_config, machine.bf16))


def verdict(cfg: Any, machine: Machine, model_config: dict[str, Any] | None) -> Verdict:
    """The planner's problems for `cfg` on `machine`, and the override sets that fix them."""
    cfg = plan_view(cfg)
    problems = problems_of(cfg, machine, model_config)
    if not problems:
        return Verdict([])
    advice: list[tuple[str, ...]] = []
    bases = placement_bases(cfg, machine)
    for base in bases:  # each starting point gets its share of the shown sets
        mine: list[tuple[str, ...]] = []
        for group in fix_groups(with_overrides(cfg, base)):
            found = next((base + fix for fix in group if accepted(cfg, base + fix, machine, model_config)), None)
            if found is not None and found and found not in mine:
                mine.append(found)
            if found == base:
                break  # the base alone fits: no trainer fix needed with it
        advice += mine[: max(1, MAX_ADVICE // len(bases))]
    return Verdict(problems, advice[:MAX_ADVICE])


def accepted(cfg: Any, overrides: tuple[str, ...], machine: Machine, model_config: dict[str, Any] | None) -> bool:
    return not problems_of(with_overrides(cfg, overrides), machine, model_config)


def placement_bases(cfg: Any, machine: Machine) -> list[tuple[str, ...]]:
    """Starting points: the plan as it is, or (when its replica slots leave the trainer no GPU) fewer slots, or
    every slot sharing the GPUs (the trainer on GPU 0, the replicas spread over the others, or all on GPU 0)."""
    inference = cfg.inference
    slots, per = fleet_slots(inference), int(inference.gpus_per_replica)
    if (
        not replicas_start_here(cfg)
        or inference.gpus
        or slots * per < machine.count
        or (machine.count == 1 == slots * per)
    ):
        return [()]
    key, fewer = replica_key(inference), max((machine.count - 1) // per, 1 if per == 1 == machine.count else 0)
    bases = []
    if fewer:
        lower = (f"{key}={fewer}",)
        if key == "inference.max_replicas" and int(inference.min_replicas) > fewer:
            lower += (f"inference.min_replicas={fewer}",)
        bases.append(lower)
    if per == 1:
        others = list(range(1, machine.count)) or [0]
        spread = [others[i % len(others)] for i in range(slots)]
        bases.append((f"inference.gpus=[{','.join(map(str, spread))}]", "trainer.gpus=[0]"))
    return bases


def fix_groups(cfg: Any) -> list[list[tuple[str, ...]]]:
    """Groups of override sets that shrink what the plan puts on a GPU, each group's gentlest first (the first that
    fits of each is offered): nothing; the trainer's activations recomputed; a smaller token budget; both; a
    smaller replica share (the largest that fits); that with recomputed activations."""
    checkpointing = checkpointing_override(cfg)
    budgets = [(f"trainer.token_budget={n}",) for n in smaller_budgets(cfg)]
    fractions = [(f"inference.gpu_memory_utilization={f}",) for f in FRACTIONS]
    groups: list[list[tuple[str, ...]]] = [[()], budgets, fractions]
    if checkpointing:
        groups[1:1] = [[checkpointing]]
        groups.insert(3, [checkpointing + budget for budget in budgets])
        groups.append([checkpointing + fraction for fraction in fractions])
    return groups


def checkpointing_override(cfg: Any) -> tuple[str, ...]:
    """The switch that recomputes activations, where it is off (under accelerate: its own, FSDP's)."""
    if cfg.launcher.name == "accelerate":
        on = cfg.launcher.accelerate.activation_checkpointing
        return () if on else ("launcher.accelerate.activation_checkpointing=true",)
    return () if cfg.trainer.gradient_checkpointing else ("trainer.gradient_checkpointing=true",)


def smaller_budgets(cfg: Any) -> list[int]:
    """trainer.token_budget halved while it still holds one max_model_len sequence (none for fixed rows: budget 0)."""
    budget, floor = int(cfg.trainer.token_budget or 0), int(cfg.inference.max_model_len)
    found = []
    while budget and budget // 2 >= floor:
        budget //= 2
        found.append(budget)
    return found
