"""The I/O half of evaluation: serve the model (our own replicas, or `inference.urls`), load the adapter by name,
sample k completions per problem through vLLM's /v1/completions (the trainer's path, token ids in), score them
with the configured reward terms, write per-problem JSONL + a summary JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import requests
import requests.adapters

from agrpo.config.schema import DataConfig, EvalConfig, RunConfig
from agrpo.config.eval_checks import ADAPTER_WEIGHTS
from agrpo.config.spec import with_values
from agrpo.errors import ConfigError, LaunchError
from agrpo.eval.scoring import ProblemResult, is_correct, problem_of, summarize, term_names, total_rewards
from agrpo.inference.replica_guard import trainer_bearer
from agrpo.models.chat_template import TurnRenderer, resolve_chat_template, run_template_kwargs
from agrpo.rewards.contract import as_messages, call_reward

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 1800.0


def eval_data_config(cfg: RunConfig) -> DataConfig:
    """The data config for the test problems: eval.path (local file) > eval.name > data.name with eval.split (the
    validation pass refused a training file, data.path, with neither: agrpo/config/eval_checks.py)."""
    ev = cfg.eval
    if ev.path:
        return with_values(cfg.data, {"path": ev.path, "name": None, "split": ev.split})
    if ev.name:
        return with_values(cfg.data, {"path": None, "name": ev.name, "split": ev.split})
    return with_values(cfg.data, {"split": ev.split})


def load_problems(cfg: RunConfig):
    """The test problems in file order (no shuffling), capped at eval.max_problems."""
    from hydra.utils import get_method

    data = eval_data_config(cfg)
    dataset = get_method(data.loader)(data, seed=cfg.trainer.seed)
    if "prompt" not in dataset.column_names:
        raise ConfigError(
            f"data.loader={data.loader!r} returned no `prompt` column: evaluation needs chat prompts "
            "(the reward terms read the gold from the other columns)"
        )
    if cfg.eval.max_problems is not None:
        dataset = dataset.select(range(min(cfg.eval.max_problems, len(dataset))))
    return dataset


def adapter_name(path: str) -> str:
    """A name that always means one set of weights (vLLM keys its prefix cache by adapter name): a hash of the
    adapter's weights file (the validation pass checked it is there), so a retrained adapter at the same path gets
    a new name."""
    weights = Path(path) / ADAPTER_WEIGHTS
    return "agrpo-eval-" + hashlib.sha256(weights.read_bytes()).hexdigest()[:12]


def connection_pool_size(concurrency: int) -> int:
    """Connections the HTTP client keeps per host: one per request in flight. requests' default of 10 made urllib3
    discard (and warn about, once per request) every connection beyond the tenth at eval.concurrency > 10."""
    return max(1, int(concurrency))


class Endpoint:
    """vLLM's OpenAI server (a replica or the proxy): adapter load/unload and token-id completions."""

    def __init__(self, url: str, concurrency: int = 1, admin_token: str | None = None):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        size = connection_pool_size(concurrency)
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=size)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if admin_token:  # the proxy's admin token (adapter loads), or the API key of the one replica it started
            self.session.headers["Authorization"] = f"Bearer {admin_token}"

    def base_model(self) -> str:
        """The served base model's name (the entry of /v1/models that is not an adapter)."""
        models = self.session.get(f"{self.url}/v1/models", timeout=60).json()["data"]
        bases = [m["id"] for m in models if not m.get("parent")]
        if not bases:
            raise LaunchError(f"{self.url}/v1/models lists no base model: {models}")
        return bases[0]

    def load_adapter(self, name: str, path: str) -> None:
        response = self.session.post(
            f"{self.url}/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(Path(path).resolve())},
            timeout=600,
        )
        if response.status_code != 200 and "already been loaded" not in response.text:
            raise LaunchError(f"loading adapter {path} as {name} failed ({response.status_code}): {response.text}")

    def unload_adapter(self, name: str) -> None:
        self.session.post(f"{self.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=600)

    def complete(self, model: str, prompt_ids: list[int], n: int, seed: int, params: dict[str, Any]) -> list[dict]:
        payload = {"model": model, "prompt": prompt_ids, "n": n, "seed": seed, "return_token_ids": True, **params}
        response = self.session.post(f"{self.url}/v1/completions", json=payload, timeout=REQUEST_TIMEOUT_S)
        if response.status_code != 200:
            raise LaunchError(f"/v1/completions failed ({response.status_code}): {response.text[:500]}")
        return sorted(response.json()["choices"], key=lambda choice: choice["index"])


@contextlib.contextmanager
def served(cfg: RunConfig, out_dir: Path) -> Iterator[tuple[str, str | None]]:
    """Yield the URL to evaluate against and the token to send there (the proxy's admin token, or the key of the one
    replica started here; None for inference.urls without a proxy): inference.urls (behind
    the proxy when several), or replicas (+ proxy) this call starts from the config with the local launcher's plan,
    always stopped afterwards (its ports held, and its secrets made, for this call alone)."""
    from agrpo.launchers.binding import bound
    from agrpo.launchers.local import plan_on_this_machine, start_services
    from agrpo.processes.managed import ManagedProcess, stop_all

    started: list[ManagedProcess] = []
    with bound(plan_on_this_machine(cfg, str(out_dir))) as plan:
        try:
            start_services(plan, plan.supervision.startup_timeout_s, started)
            yield plan.vllm_url, trainer_bearer(plan.trainer.env)  # the proxy's admin token, or the replica's key
        finally:
            stop_all(list(reversed(started)), plan.supervision.stop_timeout_s)


def sample_all(
    complete: Callable[[int], list[dict]], count: int, concurrency: int, progress: Callable[[int], Any] | None = None
) -> list[list[dict]]:
    """`complete(i)` for every problem, `concurrency` at a time, in problem order; `progress(n)` after each finishes.

    The first failure cancels what has not started and is raised (a server error must not be averaged away).
    """
    outputs: list[list[dict] | None] = [None] * count
    with ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
        futures = {pool.submit(complete, i): i for i in range(count)}
        try:
            for future in as_completed(futures):
                outputs[futures[future]] = future.result()
                if progress is not None:
                    progress(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return outputs  # type: ignore[return-value]


def progress_bar(total: int, description: str):
    """A tqdm bar over problems on stderr (left behind when done, hidden when stderr is not a terminal)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit="problem", dynamic_ncols=True, disable=None)


def score_problem(
    index: int, row: dict[str, Any], choices: list[dict], rewards: list[Any], names: list[str], cfg: RunConfig
) -> ProblemResult:
    """Score one problem's samples with every reward term, called as in training (agrpo/rewards/contract.py: each
    completion as chat messages, dataset columns repeated per sample); a failing term is one RewardError."""
    texts = [c["text"] for c in choices]
    ids = [list(c.get("token_ids") or []) for c in choices]
    columns = {key: [value] * len(texts) for key, value in row.items() if key != "prompt"}
    call = dict(completions=[as_messages(t) for t in texts], prompts=[row["prompt"]] * len(texts), completion_ids=ids)
    raw = [call_reward(reward.func, name, {**call, **columns}) for reward, name in zip(rewards, names)]
    weighted = [
        [None if s is None else reward.weight * float(s) for s in scores] for reward, scores in zip(rewards, raw)
    ]
    deciding = raw[cfg.eval.correct_term]
    return ProblemResult(
        index=index,
        problem=problem_of(row),
        answer=str(row.get("answer", "")),
        completions=texts,
        rewards=total_rewards(weighted),
        term_scores=dict(zip(names, raw)),
        correct=[is_correct(s, cfg.eval.correct_threshold) for s in deciding],
        truncated=[c.get("finish_reason") == "length" for c in choices],
        completion_tokens=[len(i) for i in ids],
    )


def eval_rewards(cfg: RunConfig, agent: Any) -> tuple[list[Any], list[str]]:
    """(the reward callables, every term's name: theirs, then the environments'; eval.correct_term indexes them, as
    the validation pass checked)."""
    from agrpo.rewards.registry import build_reward_funcs

    rewards = build_reward_funcs(cfg.reward.funcs) if cfg.reward.funcs or agent is None else []
    return rewards, term_names([r.__name__ for r in rewards] + (agent.reward_names() if agent else []))


def eval_prompts(cfg: RunConfig, problems: Any) -> tuple[Any, list[list[int]]]:
    """(the model's tokenizer with the run's chat template, each problem's prompt as token ids)."""
    from transformers import AutoTokenizer

    from agrpo.models.resolve import prepare_model

    model_path = prepare_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    if cfg.model.chat_template:  # the prompts the policy was trained on
        tokenizer.chat_template = resolve_chat_template(cfg.model.chat_template)
    render = TurnRenderer(tokenizer, run_template_kwargs(cfg), keep_prefix=False)  # as training renders a tool-less run
    return tokenizer, [render(p) for p in problems["prompt"]]


def sample_served(
    cfg: RunConfig, out_dir: Path, lora: str | None, count: int, sampler: Callable[..., Any]
) -> tuple[list[Any], str, str]:
    """(each problem's outputs, the model name served, the URL): serve, load eval.adapter as `lora` if set, sample
    every problem with `sampler(endpoint, model, index)`, unload the adapter. The replicas hold the adapter's rank:
    prepare sized inference.max_lora_rank for it."""
    ev = cfg.eval
    with served(cfg, out_dir) as (url, admin_token):
        endpoint = Endpoint(url, ev.concurrency, admin_token)
        model = endpoint.base_model()
        if lora:
            endpoint.load_adapter(lora, ev.adapter)
            model = lora
        try:
            with progress_bar(count, f"sampling k={ev.k}") as bar:
                outputs = sample_all(lambda i: sampler(endpoint, model, i), count, ev.concurrency, bar.update)
        finally:
            if lora:
                endpoint.unload_adapter(lora)
    return outputs, model, url


def write_eval(out_dir: Path, ev: EvalConfig, results: list[ProblemResult], summary: dict[str, Any]) -> None:
    with open(out_dir / ev.results_file, "w") as handle:
        for result in results:
            handle.write(json.dumps(result.to_json()) + "\n")
    (out_dir / ev.summary_file).write_text(json.dumps(summary, indent=2))


def run_eval(cfg: RunConfig, out_dir: Path) -> dict[str, Any]:
    """Evaluate, write `eval.results_file` (one JSON line per problem) and `eval.summary_file`; return the summary."""
    from agrpo.agents.build import Agent
    from agrpo.config.data_checks import reward_problems

    ev = cfg.eval  # prepared (agrpo/config/prepare.py): eval.k validated, eval.max_tokens resolved
    agent = Agent.from_config(cfg.agent)  # tools/environment: episodes with the same tools (agrpo/eval/episodes.py)
    rewards, names = eval_rewards(cfg, agent)
    lora = adapter_name(ev.adapter) if ev.adapter else None
    problems = load_problems(cfg)
    unread = reward_problems(cfg.reward.funcs, problems.column_names)
    if unread:
        raise ConfigError("; ".join(unread))
    tokenizer, prompts = eval_prompts(cfg, problems)
    params = {"max_tokens": ev.max_tokens, "temperature": ev.temperature, "top_p": ev.top_p}
    episodes = None
    if agent is not None:
        from agrpo.eval.episodes import AgentEpisodes

        episodes = AgentEpisodes(agent, tokenizer, params, run_template_kwargs(cfg))
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def sample(endpoint: Endpoint, model: str, i: int) -> Any:
        if episodes:
            return episodes.sample(endpoint, model, problems[i], ev.k, ev.seed + i * ev.k)
        return endpoint.complete(model, prompts[i], ev.k, ev.seed + i * ev.k, params)

    outputs, model, url = sample_served(cfg, out_dir, lora, len(prompts), sample)
    score = episodes.score if episodes else score_problem
    results = [score(i, problems[i], outputs[i], rewards, names, cfg) for i in range(len(outputs))]
    summary = summarize(results, ev.k)
    if episodes:
        summary["agent"] = episodes.summary(outputs)
    summary.update(
        model=str(cfg.model.name_or_path),
        served_as=model,
        adapter=ev.adapter,
        url=url,
        temperature=ev.temperature,
        max_tokens=params["max_tokens"],
        seconds=time.monotonic() - started,
    )
    write_eval(out_dir, ev, results, summary)
    return summary
