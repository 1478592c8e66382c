"""The routing policy: which replica gets a completion request. Pure code, no I/O.

Affinity is earned only by a *whole earlier prompt*:

* the same prompt again (the other rollouts of a GRPO group, ``n > 1`` aside) goes where the
  first went. The prompt is pinned when it is first *routed*, not when its answer comes back,
  so G rollouts that arrive at the same instant still land together, and the key covers every
  token, so a prompt-specific part shorter than one block still tells groups apart;
* a prompt that begins with an earlier prompt (a multi-turn continuation: prompt + completion +
  new turn) goes where that earlier prompt went, i.e. to the replica holding its KV blocks.
  Continuations are found through *anchors*: the chained hash of an earlier prompt's last full
  block, plus the lengths of the partial tails that ended prompts there.

A prefix shared with other prompts but never a whole prompt (a system prompt, a chat template,
few-shot examples) earns nothing, so it cannot drag every group onto one replica; a "prompt"
continued by more than ``template_fanout`` distinct prompts is treated as such a template too.
Everything else is cold and goes to the replica with the least outstanding work (prompt tokens
+ max_tokens x n). An affinity route spills to the least-loaded replica only past a load bound,
and the spill re-pins the prompt so the rest of its group follows instead of splitting again.
All tables live per adapter (hash seeded with its name), in a bounded LRU.

Replicas that finish work at different paces (one held to a quarter of a core, one on a busier host) are compared by
time, not tokens: with `paces` (each replica's measured pace as a share of the fastest, agrpo/proxy/pace.py) a
replica's outstanding work and the request's own work count divided by its pace, i.e. in seconds of the fastest
replica. A cold request goes where it would finish first, and an affinity route spills when its replica would finish
it that much later than the mean, so a slow replica holds work in proportion to its pace and returns it as fresh as
the others (issue 47). With equal or unknown paces every figure is the plain work of before.
"""

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from agrpo.proxy.prompts import Prompt
from agrpo.proxy.request_fields import RoutingFields
from agrpo.proxy.settings import ProxySettings

AFFINITY, SPILL, COLD = "affinity", "spill", "cold"


class NoReplica(RuntimeError):
    """No replica is available to take the request."""


@dataclass(frozen=True, slots=True)
class Decision:
    replica: int
    kind: str  # AFFINITY, SPILL or COLD
    work: float  # outstanding work this request adds to its replica until it finishes


class _PromptEntry:
    __slots__ = ("replica", "continuations")

    def __init__(self, replica: int):
        self.replica = replica
        self.continuations = 0


class _AdapterTables:
    """Routing memory of one adapter: whole prompts and continuation anchors."""

    __slots__ = ("seed", "prompts", "anchors")

    def __init__(self, name: str):
        self.seed = hash(("agrpo-adapter", name))
        self.prompts: OrderedDict[int, _PromptEntry] = OrderedDict()
        self.anchors: OrderedDict[int, int] = OrderedDict()  # chain hash -> bitmask of tails


class Router:
    """Prefix- and group-affine routing with load-bounded spills."""

    def __init__(
        self,
        block_size: int = 16,
        text_chars_per_token: int = 4,
        default_max_tokens: int = 1024,
        spill_factor: float = 1.5,
        spill_slack_requests: float = 8.0,
        template_fanout: int = 64,
        lru_size: int = 262144,
    ):
        self.block_size = block_size
        self.text_chars_per_token = text_chars_per_token
        self.default_max_tokens = default_max_tokens
        self.spill_factor = spill_factor
        self.spill_slack_requests = spill_slack_requests
        self.template_fanout = template_fanout
        self.lru_size = lru_size
        self._adapters: OrderedDict[str, _AdapterTables] = OrderedDict()
        self._size = 0
        self._cold_placed: dict[int, int] = {}  # tie-break so idle replicas take turns

    @classmethod
    def from_settings(cls, settings: ProxySettings) -> "Router":
        return cls(
            block_size=settings.block_size,
            text_chars_per_token=settings.text_chars_per_token,
            default_max_tokens=settings.default_max_tokens,
            spill_factor=settings.spill_factor,
            spill_slack_requests=settings.spill_slack_requests,
            template_fanout=settings.template_fanout,
            lru_size=settings.lru_size,
        )

    # ------------------------------------------------------------------ public API
    @property
    def tracked(self) -> int:
        """Routing entries held (prompts + anchors), bounded by `lru_size`."""
        return self._size

    def adapters(self) -> list[str]:
        return list(self._adapters)

    def work(self, request: RoutingFields) -> float:
        """Outstanding work of a request: its prompt tokens + max_tokens x n per prompt."""
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        cpt = self.text_chars_per_token
        prompt_tokens = sum(p.tokens(cpt) for p in request.prompts)
        return float(prompt_tokens + max_tokens * request.n * len(request.prompts))

    def route(
        self,
        request: RoutingFields,
        loads: Mapping[int, float],
        paces: Mapping[int, float] | None = None,
        late: Collection[int] = (),
    ) -> Decision:
        """Pick a replica among `loads` (available replica index -> outstanding work); `paces` (index -> pace as a
        share of the fastest, missing = 1) turns work into time; `late` replicas (agrpo/proxy/deadline.py) take no
        cold request, no spill and no group's pinned prompt, but do keep a continuation of a prompt they hold: that
        one's KV blocks are there, and another replica would first compute them again."""
        if not loads:
            raise NoReplica("no replica is available")
        work = self.work(request)
        costs = _costs(loads, work, paces)
        choices = {r: cost for r, cost in costs.items() if r not in late} or costs
        tables = self._tables(request.model)
        seed = tables.seed
        keys = [p.key(seed) for p in request.prompts]
        target = self._pinned(tables, keys)
        allowed = choices
        if target is None:
            target, allowed = self._continued(tables, request.prompts[0]), costs
        if target is None:
            kind, chosen = COLD, self._least_loaded(choices)
        elif target in allowed and not self._overloaded(target, work, costs):
            kind, chosen = AFFINITY, target
        else:
            kind, chosen = SPILL, self._least_loaded(choices, avoid=target)
        self._remember(tables, request.prompts, keys, chosen)
        return Decision(chosen, kind, work)

    def forget_adapters(self, names: Iterable[str]) -> int:
        """Drop all routing state of these adapters; returns how many entries went."""
        dropped = 0
        for name in names:
            tables = self._adapters.pop(name, None)
            if tables is not None:
                dropped += len(tables.prompts) + len(tables.anchors)
        self._size -= dropped
        return dropped

    # ------------------------------------------------------------------ lookups
    def _tables(self, model: str) -> _AdapterTables:
        tables = self._adapters.get(model)
        if tables is None:
            tables = self._adapters[model] = _AdapterTables(model)
        else:
            self._adapters.move_to_end(model)
        return tables

    @staticmethod
    def _pinned(tables: _AdapterTables, keys: list[int]) -> int | None:
        prompts = tables.prompts
        for key in keys:
            entry = prompts.get(key)
            if entry is not None:
                return entry.replica
        return None

    def _continued(self, tables: _AdapterTables, prompt: Prompt) -> int | None:
        """Replica of the longest earlier prompt that `prompt` continues, if any."""
        anchors = tables.anchors
        if not anchors:
            return None
        block_units = self._block_units(prompt)
        chain = prompt.chain(tables.seed, block_units)
        units = prompt.units
        for j in range(len(chain) - 1, -1, -1):
            mask = anchors.get(chain[j])
            if not mask:
                continue
            best = None
            while mask:  # every tail length that ended an earlier prompt at this block
                low = mask & -mask
                mask ^= low
                length = j * block_units + low.bit_length() - 1
                if length >= units:
                    break
                entry = tables.prompts.get(prompt.prefix_key(tables.seed, length))
                if entry is not None:
                    best = entry  # later bits are longer tails: keep the longest
            if best is not None:
                if best.continuations >= self.template_fanout:
                    return None  # continued by too many prompts: a shared template
                best.continuations += 1
                return best.replica
        return None

    def _block_units(self, prompt: Prompt) -> int:
        if prompt.is_tokens:
            return self.block_size
        return self.block_size * self.text_chars_per_token

    # ------------------------------------------------------------------ load
    def _overloaded(self, target: int, work: float, costs: Mapping[int, tuple[float, float]]) -> bool:
        """Whether `target` would finish the request past the bound: spill_factor x the mean outstanding time after
        it + slack x the request's own time (all in seconds of the fastest replica; plain work with equal paces)."""
        if len(costs) < 2:
            return False
        mean_after = (sum(held for held, _ in costs.values()) + work) / len(costs)
        held, own = costs[target]
        bound = self.spill_factor * mean_after + self.spill_slack_requests * work
        return held + own > bound

    def _least_loaded(self, costs: Mapping[int, tuple[float, float]], avoid: int | None = None) -> int:
        """The replica that would finish the request first (with equal paces: the least outstanding work)."""
        placed = self._cold_placed
        candidates = [r for r in costs if r != avoid] or list(costs)
        best = min(candidates, key=lambda r: (sum(costs[r]), placed.get(r, 0), r))
        placed[best] = placed.get(best, 0) + 1
        return best

    # ------------------------------------------------------------------ memory
    def _remember(self, tables, prompts: list[Prompt], keys: list[int], replica: int) -> None:
        """Pin every prompt of the request to `replica` now, before any answer comes back."""
        entries = tables.prompts
        for prompt, key in zip(prompts, keys):
            entry = entries.get(key)
            if entry is not None:
                entry.replica = replica
                entries.move_to_end(key)
                continue
            entries[key] = _PromptEntry(replica)
            self._size += 1
            block_units = self._block_units(prompt)
            chain = prompt.chain(tables.seed, block_units)
            anchor = chain[-1]
            tail_bit = 1 << (prompt.units - (len(chain) - 1) * block_units)
            mask = tables.anchors.get(anchor)
            if mask is None:
                tables.anchors[anchor] = tail_bit
                self._size += 1
            else:
                tables.anchors[anchor] = mask | tail_bit
                tables.anchors.move_to_end(anchor)
        if self._size > self.lru_size:
            self._evict()

    def _evict(self) -> None:
        """Drop the oldest entries of the least recently used adapters until within bounds."""
        while self._size > self.lru_size and self._adapters:
            name, tables = next(iter(self._adapters.items()))
            if tables.prompts:
                tables.prompts.popitem(last=False)
                self._size -= 1
            if tables.anchors and len(tables.anchors) >= len(tables.prompts):
                tables.anchors.popitem(last=False)
                self._size -= 1
            if not tables.prompts and not tables.anchors:
                del self._adapters[name]


def _costs(
    loads: Mapping[int, float], work: float, paces: Mapping[int, float] | None
) -> dict[int, tuple[float, float]]:
    """(outstanding work, the request's work) per replica, each divided by the replica's relative pace."""
    if not paces:
        return {r: (held, work) for r, held in loads.items()}
    costs = {}
    for r, held in loads.items():
        pace = paces.get(r) or 1.0
        costs[r] = (held / pace, work / pace)
    return costs
