"""`agent.warmstart`: a model that writes tool calls for THIS run's tools, made before the run from its tools and rows.

GRPO can only reinforce calls the model already writes, and the small CPU models (the tiny model, SmolLM2) never write
one. With `agent.warmstart.enabled`, `plan_warmstart` (called by agrpo/config/prepare.py once the config is
validated) takes a sample of the training rows and the run's tools, puts them with the settings and the base model
into a spec, and points `model.name_or_path` at a folder named by the spec's hash, with this module's
`build_warm_model` as `model.builder` and the spec as `model.builder_input` (JSON text: prepare writes nothing, the
spec travels in the run's config). The builder (run before any process starts, like every model builder) writes the
spec beside the folder (`<folder>.spec.json`, what the model card reads), calls the tool for real on each row, with
the row's own argument values, and trains the base model for `agent.warmstart.steps` supervised steps on the episodes
of agrpo/agents/warmstart_examples.py. The folder is reused while the base model, the tools (their schemas and
source), the rows, the settings and the run's chat_template_kwargs are the same.

A byte-level toy tokenizer (the tiny model's, under 1,000 tokens) gets single tokens for what a real tokenizer's
merges would shorten: the tool list of the system turn, the call's JSON pieces, the tool and argument names, and
recurring short strings among the argument values and the tools' answers (unit names, words).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agrpo.agents import warmstart_examples as ex
from agrpo.agents.sharing import TOOLS_FILE
from agrpo.errors import ConfigError
from agrpo.models.chat_template import TurnRenderer, run_template_kwargs

VERSION = 4  # of the examples and the training: a change that makes another model bumps it (a new cache entry)
MARKER = "agrpo_warmstart.json"  # written last: a folder without it is an interrupted build
BUILDER = "agrpo.agents.warmstart.build_warm_model"
PROGRESS_EVERY_S = 15.0  # a line this often while the supervised steps run (and one at the end)
TOY_VOCAB = 1000  # below it, a tokenizer is a byte-level toy: tool text gets single tokens
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
CALL_PIECES = ('{"name": "', '", "arguments": {', "}}")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def tool_functions(agent: Any, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """{name: callable} of every tool an episode of `row` is offered: standalone tools, then (with one environment)
    a fresh instance's methods, reset with the row (guarded: timeouts and the output cap apply)."""
    from agrpo.agents.environments import tool_methods

    tools = {tool.name: tool.method for tool in agent.tools}
    factories = agent.factories()
    if len(factories) > 1:
        raise ConfigError("agent.warmstart supports one environment; this run has several (agent.environment)")
    for factory in factories.values():
        instance = factory()
        if row is not None:
            instance.reset(**row)
        cls = agent.environment_classes()[None]
        tools.update({name: getattr(instance, name) for name in tool_methods(cls)})
    return tools


def source_hash(function: Any) -> str:
    """A hash of the file that defines a tool (its helpers and tables count too), else of its repr."""
    target = getattr(getattr(function, "__self__", None), "func", None) or getattr(function, "__func__", function)
    try:
        text = Path(inspect.getsourcefile(inspect.unwrap(target)) or "").read_text()
    except (OSError, TypeError):
        text = repr(target)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def spec_of(cfg: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the warm-started model is a function of (pure but for reading the tools' schemas and source)."""
    from agrpo.agents.build import Agent
    from agrpo.agents.prompt_budget import _schema

    agent = Agent.from_config(cfg.agent)
    functions = tool_functions(agent)
    settings = {k: v for k, v in _plain(cfg.agent.warmstart).items() if k not in ("enabled", "base_model")}
    settings["tool"] = called_tools(settings["tool"], list(functions))
    base = {k: _plain(cfg.model[k]) for k in ("name_or_path", "builder", "chat_template", "trust_remote_code")}
    if template_kwargs := run_template_kwargs(cfg):  # rendered as training renders; absent when empty (folders kept)
        base["chat_template_kwargs"] = template_kwargs
    return {
        "version": VERSION,
        "base": base,
        "agent": {k: v for k, v in _plain(cfg.agent).items() if k not in ("warmstart", "max_tool_output_chars")},
        "tools": {n: [_schema(f), source_hash(f)] for n, f in functions.items()},
        "rows": rows,
        "settings": settings,
        "seed": int(cfg.trainer.seed),
    }


def called_tools(named: str | None, tools: list[str]) -> str | list[str]:
    """The tool the examples call (`agent.warmstart.tool`), or, when none is named, every tool in turn: a name for
    one (so a one-tool spec reads, and hashes, as it always did), the list for several."""
    if named is None and len(tools) > 1:
        return tools
    if named is None and tools:
        return tools[0]
    if named not in tools:
        raise ConfigError(
            f"agent.warmstart.tool={named!r}: the run's tools are {sorted(tools)}; name one of them, or leave it "
            "null for every tool in turn"
        )
    return named


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


def sample_rows(cfg: Any, count: int) -> list[dict[str, Any]]:
    """The first `count` training rows (as JSON), loaded as the data checks load them."""
    from agrpo.data.loading import ORIGIN_COLUMN
    from agrpo.data.sample import SampleUnavailable, load_sample

    try:
        dataset = load_sample(cfg.data, seed=cfg.trainer.seed, keep_origin=False)
    except SampleUnavailable as why:
        raise ConfigError(f"agent.warmstart needs rows of the training data here, and {why}") from None
    rows = [dict(row) for row in dataset.select(range(min(count, len(dataset))))]
    return json.loads(json.dumps([{k: v for k, v in r.items() if k != ORIGIN_COLUMN} for r in rows], default=str))


def spec_text(spec: dict[str, Any]) -> str:
    """The spec as `model.builder_input`: JSON with every `$` escaped (`\\u0024`), so that no text of a row can read
    as an OmegaConf interpolation when the run's config.yaml is loaded."""
    return json.dumps(spec, sort_keys=True, default=str).replace("$", "\\u0024")


def planned_spec(model_cfg: Any) -> dict[str, Any]:  # the spec `plan_warmstart` put into model.builder_input
    return json.loads(model_cfg.builder_input)


def plan_warmstart(cfg: Any) -> Any:
    """`cfg` with the warm-started folder as its model and the spec it is built from as the builder's input, or `cfg`
    unchanged when the warm start is off or already planned (a Job's uploaded config). Writes nothing: the builder
    does, when it builds (prepare stays pure)."""
    warm = cfg.agent.warmstart
    if not warm.enabled or warm.base_model:
        return cfg
    spec = spec_of(cfg, sample_rows(cfg, int(warm.rows)))
    folder = Path(str(cfg.cache_dir)).expanduser() / "models" / f"warmstart-{spec_hash(spec)}"
    cfg = copy.deepcopy(cfg)
    cfg.agent.warmstart.base_model = str(cfg.model.name_or_path)
    cfg.model.name_or_path = str(folder)
    cfg.model.builder = BUILDER
    cfg.model.builder_input = spec_text(spec)
    return cfg


# ---- the builder: model.builder of a warm-started run (before any process starts) ---------------------------------


def read_spec(folder: Path) -> dict[str, Any]:
    """The spec written beside a folder built earlier (a config that names the folder without the builder's input)."""
    spec_file = folder.with_name(folder.name + ".spec.json")
    try:
        return json.loads(spec_file.read_text())
    except (OSError, ValueError):
        raise ConfigError(
            f"model.name_or_path={str(folder)!r} is built by the warm start from {spec_file}, which is missing or "
            "unreadable: run with agent.warmstart.enabled=true and the base model as model.name_or_path"
        ) from None


def played(spec: dict[str, Any]) -> tuple[list[ex.Episode], list[Any], dict[str, Any]]:
    """(the episodes, the values worth a token of their own, the tools' JSON schemas): every row's call made for
    real, with the row's argument values; with several tools, row i calls the (i mod n)-th."""
    from agrpo.agents.build import Agent

    settings, rows = spec["settings"], spec["rows"]
    # the tools' own answers: the run's cap (agent.max_tool_output_chars) is not the examples' (ex.example_answer)
    agent = Agent.from_config(OmegaConf.create({**spec["agent"], "max_tool_output_chars": None}))
    names = [settings["tool"]] if isinstance(settings["tool"], str) else settings["tool"]
    functions = tool_functions(agent)
    signatures = {name: ex.tool_parameters(functions[name]) for name in names}
    try:
        mappings = ex.argument_mappings(settings["arguments"], {n: params for n, (params, _) in signatures.items()})
    except ValueError as error:
        raise ConfigError(str(error)) from None
    unknown = [f for f in ex.answer_fields(settings["answer"]) if f != "output" and f not in rows[0]]
    if unknown:
        raise ConfigError(f"agent.warmstart.answer={settings['answer']!r} reads {unknown}, which the rows lack")
    calls, outputs, answers, values = [], [], [], []
    for index, row in enumerate(rows):
        name = names[index % len(names)]  # every tool in turn
        arguments, output = call_on_row(agent, name, signatures[name], mappings[name], row)
        calls.append({"name": name, "arguments": arguments})
        outputs.append(output)
        answers.append(ex.final_answer(settings["answer"], output, row))
        values += [*arguments.values(), output]
    episodes = ex.episodes([r["prompt"] for r in rows], calls, outputs, answers, settings["call_share"], spec["seed"])
    from agrpo.agents.prompt_budget import _schema

    # rendered from the live tools, in TRL's order and key order (the spec file's copy has its keys sorted)
    schemas = [_schema(function) for function in functions.values()]
    return episodes, values, schemas


def call_on_row(agent: Any, name: str, signature: tuple, mapping: dict[str, str], row: dict[str, Any]):
    """(the arguments, the tool's answer as text) of tool `name` called for real with `row`'s values."""
    parameters, required = signature
    try:
        arguments = ex.call_arguments(parameters, required, row, mapping)
    except ValueError as error:
        raise ConfigError(f"agent.warmstart, tool {name}: {error}") from None
    function = tool_functions(agent, row)[name]
    try:
        output = function(**arguments)
    except Exception as error:  # a tool that fails on the data's own arguments cannot teach its use
        raise ConfigError(
            f"agent.warmstart: tool {name}({arguments}) raised {type(error).__name__}: {error} on a data row; "
            "check agent.warmstart.arguments (which column feeds which argument)"
        ) from None
    return arguments, ex.example_answer(output if isinstance(output, str) else json.dumps(output))


def base_model(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(model, tokenizer) of the base, built or fetched as model.builder would, with the run's chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agrpo.models.resolve import prepare_model

    base = spec["base"]
    step = {"name_or_path": base["name_or_path"], "builder": base["builder"], "builder_input": None}
    path = prepare_model(OmegaConf.create(step))
    remote = bool(base.get("trust_remote_code"))
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote)
    if base.get("chat_template"):
        from agrpo.models.chat_template import resolve_chat_template

        tokenizer.chat_template = resolve_chat_template(base["chat_template"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=remote)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def toy_tokens(tokenizer: Any, schemas: list[dict], values: list[Any]) -> list[str]:
    """Single tokens for a byte-level toy tokenizer: the system turn's tool list, the call's pieces, the tool and
    argument names, recurring short values (none for a real tokenizer)."""
    if len(tokenizer) >= TOY_VOCAB:
        return []
    text = tokenizer.apply_chat_template([{"role": "user", "content": "-"}], tools=schemas, tokenize=False)
    opening = "<|im_start|>system\n"
    block = []
    if opening in text and "<|im_end|>" in text[text.index(opening) :]:
        start = text.index(opening) + len(opening)
        block = [text[start : text.index("<|im_end|>", start)]]
    names = [s["function"]["name"] for s in schemas]
    names += [f'"{p}": ' for s in schemas for p in s["function"].get("parameters", {}).get("properties", {})]
    return block + [*TOOL_TAGS, *CALL_PIECES, *names, *ex.recurring_strings(values)]


def check_tokenizer(cfg: Any, tokenizer: Any) -> Any:
    """The base model's tokenizer as the data check should count with it while the warm start is pending (the data
    check runs before the warm model exists): with the single tokens `build_warm_model` will add for the run's tools
    (the tool list of the system turn, the call's pieces, the names), in place. An upper bound on the warm model's
    counts: the tokens it also adds for recurring argument values and tool answers only shorten (they need every
    tool called on every sampled row, which the build does and a check should not)."""
    from agrpo.agents.build import Agent
    from agrpo.agents.prompt_budget import _schema

    try:
        functions = tool_functions(Agent.from_config(cfg.agent))
    except Exception:  # reported by agents/checks.py (the tools) or by the warm start itself (several environments)
        return tokenizer
    schemas = [_schema(function) for function in functions.values()]
    if None not in schemas:
        tokenizer.add_tokens(toy_tokens(tokenizer, schemas, []))
    return tokenizer


def example_rows(tokenizer: Any, episodes: list[ex.Episode], schemas: list[dict], kwargs: dict | None) -> list[tuple]:
    """Each episode as (ids, labels, where the tool's answer starts), rendered as training renders the run's turns
    (`kwargs`: the run's chat_template_kwargs; TRL's training template where the model's own drifts)."""
    renderer = TurnRenderer(tokenizer, kwargs)

    def render(messages: list[dict], generation: bool) -> list[int]:
        return renderer(messages, schemas, generation)

    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    return [ex.tokens(render, encode, tokenizer.eos_token_id, episode) for episode in episodes]


def batches(rows: list[tuple], steps: int, batch_size: int, tokens: tuple[int, int, int], seed: int):
    """`steps` batches of snippets (the calls' arguments, the replies copied into the answer), then `steps` rounds of a batch of whole episodes followed by
    snippets of its calling episodes (their calls, their replies and answers): 3 batches per step in all."""
    pad, eos, vocab = tokens
    rng = random.Random(seed)
    calling = [row for row in rows if row[2] < len(row[0]) - 2]
    for _ in range(steps):
        some = rng.sample(calling, min(batch_size, len(calling)))
        yield padded(ex.answer_snippets(some, rng, 4, vocab) + ex.call_snippets(some, eos, rng, 4, vocab), pad)
    order: list[tuple] = []
    for _ in range(steps):
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = rng.sample(rows, len(rows))  # each epoch in a new order
            batch.append(order.pop())
        yield padded(batch, pad)
        snippets = ex.answer_snippets(batch, rng, 2, vocab) + ex.call_snippets(batch, eos, rng, 4, vocab)
        yield padded(snippets or batch, pad)


def padded(rows: list[tuple[list[int], list[int], int]], pad: int):
    """(input ids, attention mask, labels) tensors of `rows`, padded on the right."""
    import torch

    width = max(len(ids) for ids, _, _ in rows)
    return (
        torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in rows]),
        torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in rows]),
        torch.tensor([labels + [ex.IGNORE] * (width - len(labels)) for _, labels, _ in rows]),
    )


def supervised_steps(model: Any, batches: Any, lr: float, total_batches: int) -> None:
    """AdamW over `batches` of (input_ids, attention_mask, labels), in place, the learning rate falling linearly to
    5% over `total_batches`, on one thread (a CPU shared with running servers slows many threads down)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: max(0.05, 1 - done / total_batches))
    model.train()
    started = last = time.monotonic()
    try:
        for done, (input_ids, attention_mask, labels) in enumerate(batches, start=1):
            model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            if time.monotonic() - last >= PROGRESS_EVERY_S or done == total_batches:
                last = time.monotonic()
                print(ex.progress_line(done, total_batches, last - started), file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads)
    model.eval()


def train(model: Any, rows: list[tuple], settings: dict[str, Any], tokens: tuple[int, int, int], seed: int) -> None:
    """The supervised steps, in place; batches() yields 3 per step."""
    import torch

    torch.manual_seed(seed)
    steps = int(settings["steps"])
    chunks = batches(rows, steps, int(settings["batch_size"]), tokens, seed)
    supervised_steps(model, chunks, float(settings["learning_rate"]), 3 * steps)


def build_warm_model(output_dir: str, builder_input: str | None = None) -> str:
    """model.builder of a warm-started run: the folder `plan_warmstart` named, built from its spec (the run's
    `model.builder_input`, written beside the folder here; without it, the one written there before), or reused."""
    import torch

    from agrpo.models.folder import folder_matches, save_model_folder

    folder = Path(output_dir).expanduser().resolve()
    spec = json.loads(builder_input) if builder_input else read_spec(folder)
    if builder_input and not (written := folder.with_name(folder.name + ".spec.json")).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(json.dumps(spec, sort_keys=True, indent=1, default=str))
    marker = {"spec": spec_hash(spec)}
    if folder_matches(folder, MARKER, marker):
        return str(folder)
    episodes, values, schemas = played(spec)
    steps = int(spec["settings"]["steps"])
    print(
        f"agent.warmstart: building {folder.name} from {spec['base']['name_or_path']}: {len(episodes)} examples "
        f"played with the tools, then {3 * steps} supervised batches (a line every {PROGRESS_EVERY_S:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    model, tokenizer = base_model(spec)
    added = toy_tokens(tokenizer, schemas, values)
    if added:
        tokenizer.add_tokens(added)
        torch.manual_seed(spec["seed"])
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    rows = example_rows(tokenizer, episodes, schemas, spec["base"].get("chat_template_kwargs"))
    tokens = (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer))
    train(model, rows, spec["settings"], tokens, spec["seed"])
    saved = save_model_folder(model, tokenizer, folder, MARKER, marker)
    (saved / TOOLS_FILE).write_text(json.dumps(schemas))  # what `agrpo push`'s card offers a served request
    return str(saved)
