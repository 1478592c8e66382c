"""The training data, opened before anything starts: part of the one validation pass (dry run included), exit 2.

The config alone cannot show a reward reading `column: anwser`, a template naming `{questoin}` or a misspelt reward
option; each used to surface only once vLLM had started (about 45 s in), with exit 1. Here the data is loaded with
the trainer's own loader: whole when it is on this machine (a local `data.path`, or the synthetic smoke task), as a
bounded sample (the first rows, within a minute) for a Hub dataset (data=hub, streamed) or a `data.loader` of one's
own (agrpo/data/sample.py; agrpo's own gsm8k/MATH/AIME mappings are loaded by the trainer), then:

- every option bound to a reward term is a parameter of its function (of the function it wraps, for a wrapper);
- every column a term reads exists: an agrpo reward's `column:`, and any parameter of a reward function that has no
  default and is neither one of TRL's arguments nor a bound option (`def f(completions, answer, **columns)` reads
  `answer`);
- a sample of rows (the first ones and the longest ones) renders through the model's chat template when its tokenizer
  is on this machine, TRL's rollout worker recognises that template, and the longest prompt leaves room for
  trainer.max_completion_length within inference.max_model_len. In an agent run the rows are rendered as training
  renders them, with the tool list, and the longest episode (every turn and tool answer) must fit too
  (agrpo/agents/prompt_budget.py). A pending agent.warmstart is counted with the base tokenizer and the tokens the
  warm start will add (agrpo/agents/warmstart.py:check_tokenizer, an upper bound).

Every problem names the key to change.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agrpo.config.ranges import did_you_mean
from agrpo.errors import ConfigError

FIRST_ROWS = 8
LONGEST_ROWS = 8
log = logging.getLogger("agrpo")
TERM_KEYS = ("_target_", "weight", "name")  # what a reward term holds besides the options bound to its function
TRL_ARGUMENTS = ("completions", "prompts", "completion_ids")


# ---- reward terms against the dataset's columns (pure but for importing the reward functions) -------------------


def _plain(func: Any) -> Any:
    """The function itself (a reward from a file is loaded)."""
    from agrpo.rewards.registry import FileFunction

    return func.load() if isinstance(func, FileFunction) else func


def _parameters(func: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(_plain(func)).parameters)
    except (TypeError, ValueError):
        return {}


def _named(parameters: Mapping[str, inspect.Parameter]) -> set[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {name for name, p in parameters.items() if p.kind in kinds} - set(TRL_ARGUMENTS)


def columns_read(func: Any, options: Mapping[str, Any]) -> list[str]:
    """The dataset columns `func` reads with `options` bound: its required parameters, plus an agrpo reward's
    `column` (bound, or its default)."""
    parameters = _parameters(func)
    needed = [
        name
        for name in sorted(_named(parameters) - set(options))
        if parameters[name].default is inspect.Parameter.empty
    ]
    module = getattr(_plain(func), "__module__", "") or ""
    column = options.get("column", getattr(parameters.get("column"), "default", None))
    if module.startswith("agrpo.rewards") and isinstance(column, str) and column not in needed:
        needed.append(column)
    return needed


def term_problems(index: int, term: Mapping[str, Any], column_names: Sequence[str]) -> list[str]:
    """What is wrong with one `reward.funcs` term against the dataset's columns."""
    from agrpo.rewards.registry import resolve_target

    key = f"reward.funcs[{index}]"
    try:
        func = resolve_target(str(term["_target_"]))
    except Exception:  # reported by the environment checks, which name the import error
        return []
    options = {k: v for k, v in term.items() if k not in TERM_KEYS}
    declared = _named(_parameters(func))
    if "reward" in declared and isinstance(options.get("reward"), str):  # a wrapper: the rest goes to what it wraps
        try:
            func = resolve_target(options["reward"])
        except Exception as error:
            return [f"{key}.reward={options['reward']!r} cannot be imported: {error}"]
        options = {k: v for k, v in options.items() if k not in declared}
        declared = _named(_parameters(func))
    problems = [
        f"{key} ({term['_target_']}) takes no option {name!r}{did_you_mean(name, sorted(declared), f'{key}.')}; "
        f"its options are {sorted(declared)}"
        for name in sorted(set(options) - declared)
        if declared
    ]
    missing = [column for column in columns_read(func, options) if column not in column_names]
    if missing:
        problems.append(
            f"{key} ({term['_target_']}) reads column(s) {missing}, but the dataset's columns are "
            f"{sorted(column_names)}: set the term's `column:`, or rename a column with data.columns"
            + did_you_mean(missing[0], list(column_names))
        )
    return problems


def reward_problems(funcs: Any, column_names: Sequence[str]) -> list[str]:
    """Every term of `reward.funcs` checked against the columns (a config node or plain dicts)."""
    terms = OmegaConf.to_container(funcs, resolve=True) if OmegaConf.is_config(funcs) else list(funcs or [])
    problems: list[str] = []
    for index, term in enumerate(terms):
        if isinstance(term, Mapping) and term.get("_target_"):
            problems += term_problems(index, term, column_names)
    return problems


# ---- rows through the chat template ----------------------------------------------------------------------------


def sample_indices(prompts: Sequence[Any]) -> list[int]:
    """The first rows, and the longest prompts (by characters): those most likely to be refused for length."""

    def size(prompt: Any) -> int:
        if isinstance(prompt, list):
            return sum(len(str(m.get("content", ""))) for m in prompt if isinstance(m, Mapping))
        return len(str(prompt))

    longest = sorted(range(len(prompts)), key=lambda i: size(prompts[i]), reverse=True)[:LONGEST_ROWS]
    return sorted(set(range(min(FIRST_ROWS, len(prompts)))) | set(longest))


def unreadable_model(name: str, error: BaseException) -> str:
    """One paragraph for a model folder transformers refuses to read (a config.json field of the wrong type, say):
    before any process starts, instead of the library's traceback."""
    reason = " ".join(str(error).split())[:400]
    return (
        f"model.name_or_path={name!r}: transformers cannot read this model ({type(error).__name__}: {reason}). "
        "Fix the folder's config.json (or tokenizer files), or name another model; nothing was started."
    )


def local_tokenizer(model_cfg: DictConfig) -> Any | None:
    """The model's tokenizer with `model.chat_template` applied, if it is on this machine (None otherwise: a model
    built on first use, or a Hub id not downloaded yet, is checked by the trainer)."""
    from transformers import AutoTokenizer

    name = str(model_cfg.name_or_path)
    if not Path(name).expanduser().is_dir() and model_cfg.builder:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name, trust_remote_code=model_cfg.trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError):
        return None
    except Exception as error:  # transformers' own validation of the folder's config.json
        raise ConfigError(unreadable_model(name, error)) from None
    if model_cfg.chat_template:
        from agrpo.models.chat_template import resolve_chat_template

        tokenizer.chat_template = resolve_chat_template(model_cfg.chat_template)
    return tokenizer


def trl_template_problem(tokenizer: Any, model_cfg: DictConfig) -> str | None:
    """TRL's rollout worker refuses a chat template it does not know ("Unrecognized chat template")."""
    import copy

    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return None
    try:
        add_response_schema(copy.copy(tokenizer))
    except ValueError:
        return (
            f"TRL's rollout worker does not recognise the chat template of model.name_or_path="
            f"{str(model_cfg.name_or_path)!r}: set model.chat_template to one of TRL's templates that renders the "
            "same conversation (e.g. qwen2_5 for ChatML models; recipes/gsm8k_cpu.yaml does this for SmolLM2)"
        )
    return None


def row_label(data_cfg: DictConfig, origins: Sequence[int]) -> Callable[[int], str]:
    """How a problem names row `index` of the checked dataset: the line of a JSONL file (blank lines hold no row and
    the prompts are shuffled, so neither index is it), else its place in the data as loaded, counting from 0."""
    lines: list[int] | None = None
    loader = str(data_cfg.loader)
    if str(data_cfg.path or "").endswith(".jsonl") and loader.endswith((".load_jsonl", ".load_hub")):
        from agrpo.data.jsonl_lines import jsonl_row_lines

        lines = jsonl_row_lines(data_cfg.path)  # one entry per row: the loader keeps every row, in order
    if lines is not None and len(lines) > max(origins, default=-1):
        return lambda index: f"line {lines[origins[index]]} of {data_cfg.path}"
    return lambda index: f"row {origins[index]} (counting from 0, before shuffling)"


def template_problems(
    cfg: DictConfig, dataset: Any, tokenizer: Any, label: Callable[[int], str] | None = None
) -> list[str]:
    """Sampled rows render through the chat template (with the tool list, in an agent run, as training renders them:
    agrpo/agents/prompt_budget.py) and fit inference.max_model_len with the completion (and, in an agent run, the
    longest episode fits); `label` names a row by its index in `dataset` (default: `row N`)."""
    from agrpo.agents.prompt_budget import AgentPrompts
    from agrpo.rewards.contract import describe_row

    label = label or (lambda index: f"row {index}")
    unknown = trl_template_problem(tokenizer, cfg.model)
    problems = [unknown] if unknown else []
    prompts = dataset["prompt"]
    agent = AgentPrompts.for_run(cfg, dataset, tokenizer)

    def length(index: int) -> int:
        if agent is not None:
            return agent.length(index)
        return len(tokenizer.apply_chat_template(prompts[index], add_generation_prompt=True, return_dict=False))

    longest, where = 0, None
    for index in sample_indices(prompts):
        try:
            tokens = length(index)
        except Exception as error:  # jinja raises its own errors for rows it cannot render
            return problems + [
                f"{label(index)} [{describe_row({'prompts': [prompts[index]]})}] does not render through the chat "
                f"template of model.name_or_path={str(cfg.model.name_or_path)!r}: {type(error).__name__}: {error} "
                "(fix the row's messages, or set model.chat_template)"
            ]
        if tokens > longest:
            longest, where = tokens, index
    row_text = describe_row({"prompts": [prompts[where]]}) if where is not None else ""
    if agent is not None:
        found = agent.problem(longest, where, row_text, label(where)) if where is not None else None
        return problems + ([found] if found else [])
    room = cfg.inference.max_model_len - cfg.trainer.max_completion_length
    if longest > room:
        problems.append(
            f"the prompt at {label(where)} is {longest} tokens [{row_text}], more "
            f"than inference.max_model_len={cfg.inference.max_model_len} - trainer.max_completion_length="
            f"{cfg.trainer.max_completion_length} = {room}: vLLM would refuse it; raise inference.max_model_len or "
            "shorten the prompts"
        )
    return problems


def unreadable(data_cfg: DictConfig, error: BaseException) -> str:
    """The problem of data that failed to open: which key, and the reader's (or the loader's) first line."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if data_cfg.path:
        return f"data.path={str(data_cfg.path)!r} could not be read: {first}"
    if str(data_cfg.loader) == "agrpo.data.hub.load_hub":
        return (
            f"data.name={str(data_cfg.name)!r} (config {data_cfg.config_name!r}, split {data_cfg.split!r}) could not "
            f"be loaded: {type(error).__name__}: {first} (check the dataset id, data.config_name and data.split)"
        )
    return (
        f"data.loader={str(data_cfg.loader)!r} failed on a sample of the data: {type(error).__name__}: {first} (it is "
        "called as f(data_cfg, seed) and must return a datasets.Dataset with a `prompt` column)"
    )


# ---- the entry point --------------------------------------------------------------------------------------------


def opens_here(data_cfg: DictConfig) -> bool:
    """Whether the checks open the training data here: a local file or the smoke task whole, a Hub dataset or a
    loader of one's own as a bounded sample (agrpo/data/sample.py)."""
    from agrpo.data.sample import sample_source

    return sample_source(data_cfg) is not None


def opened_data_problems(cfg: DictConfig) -> list[str]:
    """Open the training data and check it against the rewards and the chat template (see the module docstring)."""
    if not opens_here(cfg.data):
        return []
    from datasets.utils import logging as datasets_logging

    from agrpo.data.loading import ORIGIN_COLUMN
    from agrpo.data.sample import SampleUnavailable, load_sample

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()  # a check's output is its problems (or nothing), not loading bars
    try:
        dataset = load_sample(cfg.data, seed=cfg.trainer.seed, keep_origin=True)
        origins = dataset[ORIGIN_COLUMN]
        dataset = dataset.remove_columns(ORIGIN_COLUMN)
        label = row_label(cfg.data, origins)
    except SampleUnavailable as why:
        log.info("the training rows were not checked before the start (%s): the trainer checks them", why)
        return []
    except ConfigError as error:
        return [str(error)]
    except Exception as error:  # a malformed file or a failing loader: the reader's own words
        return [unreadable(cfg.data, error)]
    finally:
        if shown:
            datasets_logging.enable_progress_bar()
    problems = reward_problems(cfg.reward.funcs, dataset.column_names)
    tokenizer = local_tokenizer(cfg.model)
    if tokenizer is not None and cfg.agent.warmstart.enabled and not cfg.agent.warmstart.base_model:
        from agrpo.agents.warmstart import check_tokenizer

        tokenizer = check_tokenizer(cfg, tokenizer)  # the warm model is built later, from this base and these tools
    if tokenizer is not None and len(dataset):
        problems += template_problems(cfg, dataset, tokenizer, label)
    return problems
