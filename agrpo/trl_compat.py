"""Every part of TRL that agrpo relies on beyond its public API, checked when a run is prepared.

agrpo's rollout worker goes through TRL 1.16's public `rollout_worker=` hook (agrpo/trainer/rollout/worker.py). Beyond
that, agrpo subclasses TRL's trainer and vLLM client and overrides their (some private) methods, replaces a few names
of its modules, and reads private attributes of its trainer (agrpo/trainer/seam/); its rollout loop is agrpo's own,
built from public pieces of TRL (agrpo/trainer/rollout/, listed here too: a rename breaks it as loudly). TRL may rename any of them in a minor release, and a rename is silent: an override of a method TRL no
longer calls never runs (the run trains on, with TRL's behaviour).
`TRL_NAMES` lists each such name: its module, its path in that module (`name` or `Class.member`; a member may be a
method, a class attribute or an instance attribute TRL assigns in one of the class's methods), for a function the
parameters agrpo's override or replacement is written against (exactly, `self` left out) or the keywords agrpo passes
through (`takes`), and the agrpo module that relies on it.

`trl_problems` reads TRL's source (ast: nothing is imported, so it costs milliseconds and runs before TRL could log
or start anything) and returns one sentence per missing or changed name; `check_trl` raises `TrlChanged` (exit 2)
with all of them and the TRL version found. agrpo/config/prepare.py calls it for every run whose trainer starts on
this machine, before validation and before any replica starts. tests/trainer/test_trl_compat.py fails when agrpo's
source uses a private TRL name that is not listed here, and renames names in a copy of TRL to see a run refuse.

To rely on a new private name: add a `TrlName` here (the test says which one is missing) and, where agrpo patches a
module attribute at run time, take the module through `require` (it refuses a name that is not listed).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from agrpo.errors import AgrpoError

TRL_SERIES = "1.16"  # the TRL agrpo is written against (pyproject.toml: trl==1.16.*)

W = "trl.experimental.async_grpo.async_rollout_worker"
T = "trl.experimental.async_grpo.async_grpo_trainer"
C = "trl.experimental.async_grpo.vllm_client"
P = "trl.experimental.async_grpo.packing"
U = "trl.trainer.utils"
CT = "trl.chat_template_utils"


class TrlChanged(AgrpoError):
    """The installed TRL lacks or changed a name agrpo overrides, patches or reads."""

    exit_code = 2


@dataclass(frozen=True)
class TrlName:
    module: str
    path: str  # "name" in the module, or "Class.member"
    used_by: str  # the agrpo module that relies on it: under agrpo/trainer/, or a path from agrpo/ itself
    params: tuple[str, ...] | None = None  # a function's parameters, exactly (self left out)
    takes: tuple[str, ...] = ()  # keywords it must still take
    why: str = ""  # for a private name: why no public hook of TRL serves (tests/trainer/test_trl_compat.py)

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.path}"


NO_SYNC_HOOK = "no public hook: `weight_transfer=` streams merged weights, agrpo publishes adapter folders"
NO_STATE_HOOK = "TRL keeps the rollout position for its own worker only (an isinstance check)"


TRL_NAMES: tuple[TrlName, ...] = (
    # Public pieces agrpo's own rollout loop (agrpo/trainer/rollout/) is built from: TRL's sample and row types (what
    # TRL's trainer drains), its chat-template and response parsing, its reward calling helpers.
    TrlName(W, "RolloutSample.model_version", "rollout/scorer"),
    TrlName(W, "RolloutSample", "rollout/scorer, rollout/loop"),
    TrlName(W, "TrainingSequence", "rollout/sequences"),
    TrlName(CT, "parse_response", "rollout/episode", ("tokenizer", "ids", "prefix", "tools")),
    TrlName(CT, "add_response_schema", "agrpo/models/chat_template", ("processing_class",)),
    TrlName(CT, "is_chat_template_prefix_preserving", "agrpo/models/chat_template", ("processing_class",)),
    TrlName(CT, "get_training_chat_template", "agrpo/models/chat_template"),
    TrlName(U, "get_callable_name", "rollout/scorer", ("func",)),
    TrlName(U, "is_async_callable", "rollout/scorer", ("func",)),
    TrlName(
        U,
        "print_prompt_completions_sample",
        "rollout/loop",
        takes=("prompts", "completions", "rewards", "advantages", "step", "num_samples"),
    ),
    # The trainer, subclassed (seam/trainer): the adapter sync (no public hook: TRL's `weight_transfer=` streams merged
    # weights, agrpo publishes adapter folders), read only there; its metrics; its worker and client
    # (read with getattr(..., None) for ranks that have none: a rename would silently turn the feature off).
    TrlName(T, "AsyncGRPOTrainer._sync_weight_lora", "seam/trainer", ("t0",), why=NO_SYNC_HOOK),
    TrlName(T, "AsyncGRPOTrainer._lora_dir", "seam/trainer", why="where TRL publishes; " + NO_SYNC_HOOK),
    TrlName(T, "AsyncGRPOTrainer._lora_name", "seam/trainer", why="what TRL names versions; " + NO_SYNC_HOOK),
    TrlName(T, "AsyncGRPOTrainer._adapter_name", "seam/trainer", why="the adapter TRL ships; " + NO_SYNC_HOOK),
    TrlName(T, "AsyncGRPOTrainer._lora_sync", "seam/trainer", why="whether requests name `<lora>-vN`; no public flag"),
    TrlName(T, "AsyncGRPOTrainer._metrics", "seam/trainer", why="no public sink for a step's own figures"),
    # The rollout position in checkpoints: TRL saves and restores it for its own worker only (an isinstance check).
    TrlName(T, "AsyncGRPOTrainer._save_checkpoint", "seam/trainer", ("model", "trial"), why=NO_STATE_HOOK),
    TrlName(T, "AsyncGRPOTrainer._trained_groups", "seam/trainer", why=NO_STATE_HOOK),
    TrlName(T, "AsyncGRPOTrainer._groups_before_resume", "seam/trainer", why=NO_STATE_HOOK),
    # Public names agrpo's worker is built from (TRL's public hook and what it derives in __init__).
    TrlName(T, "AsyncGRPOTrainer.__init__", "seam/trainer", takes=("rollout_worker",)),
    TrlName(T, "AsyncGRPOTrainer.eos_token_ids", "seam/trainer"),
    TrlName(T, "AsyncGRPOTrainer.vllm_client", "seam/trainer, trl_backend, sync/mode, sync/retention"),
    TrlName(T, "AsyncGRPOTrainer.rollout_worker", "seam/trainer, rollout/guard, rollout/pacing, sync/mode"),
    TrlName(T, "AsyncGRPOTrainer.rollout_queue", "seam/trainer"),
    TrlName(T, "AsyncGRPOTrainer.model_version", "seam/trainer"),
    TrlName(T, "AsyncGRPOTrainer.log", "seam/trainer", ("logs", "start_time")),
    TrlName(T, "shutil", "seam/module_patches"),
    TrlName(T, "VLLMClient", "seam/module_patches"),
    TrlName(T, "create_model_from_path", "seam/module_patches"),
    TrlName(T, "save_lora_adapter", "trl_backend", ("model", "accelerator", "adapter_name", "dest_dir")),
    TrlName(T, "get_peak_flops_per_device", "seam/cpu_compat"),
    TrlName(U, "get_peak_flops_per_device", "seam/cpu_compat", ("accelerator", "dtype")),
    TrlName(U, "get_config_model_id", "seam/trainer", ("config",)),
    # The vLLM client, subclassed (seam/client): its HTTP module (the admin token) and its adapter calls.
    TrlName(C, "requests", "seam/module_patches, seam/client"),
    TrlName(C, "VLLMClient.__init__", "seam/client", ("server_url", "server_timeout")),
    TrlName(C, "VLLMClient.load_lora_adapter", "seam/client", ("lora_name", "lora_path", "timeout")),
    TrlName(C, "VLLMClient.unload_lora_adapter", "seam/client", ("lora_name", "timeout")),
    TrlName(C, "VLLMClient.server_url", "seam/client, sync/mode"),
    # Packed attention's kernel loader (seam/module_patches).
    TrlName(P, "_flash_attn", "seam/module_patches", (), why="TRL's packed attention takes no kernel argument"),
)


# ---- reading TRL's source -----------------------------------------------------------------------------------------


def trl_root() -> Path | None:
    """The `trl` package Python would import here (first on sys.path), found without importing it."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return "unknown"


@cache
def _parsed(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError):
        return None


def module_tree(root: Path, module: str) -> ast.Module | None:
    """The parsed source of `module` (a dotted name under trl) in the package at `root`, or None."""
    parts = module.split(".")[1:]
    base = root.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return _parsed(path)
    return None


def _walk_bindings(statements: list[ast.stmt]):
    """(name, node) for every name a block binds at its own level: defs, classes, assignments, imports, also inside
    if/try/with (TRL imports `requests` under `if is_requests_available():`)."""
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    yield target.id, node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name.split(".")[0]), node
        for block in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)) and hasattr(node, block):
                yield from _walk_bindings(getattr(node, block))


def _binding(tree: ast.Module, name: str) -> ast.AST | None:
    return next((node for bound, node in _walk_bindings(tree.body) if bound == name), None)


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Names assigned as `self.NAME = ...` in any method of `cls`."""
    found = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else []:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def _imported_from(node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")[: -node.level]
    return ".".join(package + ([node.module] if node.module else []))


def _class(root: Path, module: str, name: str, depth: int = 0) -> tuple[ast.ClassDef, str] | None:
    """The class `name` as `module` binds it (defined there, or imported from another TRL module)."""
    tree = module_tree(root, module)
    node = _binding(tree, name) if tree else None
    if isinstance(node, ast.ClassDef):
        return node, module
    if isinstance(node, ast.ImportFrom) and depth < 5:
        source = _imported_from(node, module)
        if source.startswith("trl"):
            return _class(root, source, name, depth + 1)
    return None


def _member(root: Path, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> ast.AST | bool | None:
    """`name` in `cls` or its TRL bases: the def node, True for an attribute, None when absent."""
    node = _binding(ast.Module(body=cls.body, type_ignores=[]), name)
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return True  # a dataclass field without a default: only instances have it
    if node is not None:
        return node
    if name in _instance_attributes(cls):
        return True
    for base in cls.bases:
        found = _class(root, module, base.id, depth + 1) if isinstance(base, ast.Name) and depth < 5 else None
        if found is not None and (member := _member(root, found[1], found[0], name, depth + 1)) is not None:
            return member
    return None


def parameters(func: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> tuple[str, ...]:
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args]
    names = names[1:] if method and names and names[0] in ("self", "cls") else names
    names += [f"*{args.vararg.arg}"] if args.vararg else []
    names += [a.arg for a in args.kwonlyargs] + ([f"**{args.kwarg.arg}"] if args.kwarg else [])
    return tuple(names)


def _file(entry: TrlName) -> str:
    first = entry.used_by.split(",")[0]
    return f"{first}.py" if first.startswith("agrpo/") else f"agrpo/trainer/{first}.py"


def locate(root: Path, entry: TrlName) -> ast.AST | bool | None:
    """Where the TRL at `root` defines `entry`: its node, True for an instance attribute (`self.NAME = ...` in a
    method of the class, or a dataclass field without a default), None when it does not."""
    tree = module_tree(root, entry.module)
    owner, _, member = entry.path.rpartition(".")
    if tree is None or not owner:
        return _binding(tree, member) if tree else None
    found = _class(root, entry.module, owner)
    return _member(root, found[1], found[0], member) if found else None


def name_problem(root: Path, entry: TrlName) -> str | None:
    """Why `entry` does not hold in the TRL at `root`, or None."""
    tree = module_tree(root, entry.module)
    if tree is None:
        return f"module {entry.module} is gone (used by {_file(entry)})"
    owner = "." in entry.path
    node = locate(root, entry)
    where = f"used by agrpo/trainer/{{{entry.used_by}}}" if "," in entry.used_by else f"used by {_file(entry)}"
    if node is None:
        return f"{entry.dotted} is gone ({where})"
    if entry.params is None and not entry.takes:
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"{entry.dotted} is no longer a function ({where})"
    found_params = parameters(node, method=bool(owner))
    missing = [name for name in entry.takes if name not in found_params]
    if missing:
        return f"{entry.dotted} no longer takes {', '.join(missing)} ({where})"
    if entry.params is not None and found_params != entry.params:
        now, expected = ", ".join(found_params), ", ".join(entry.params)
        return f"{entry.dotted} now takes ({now}) where agrpo expects ({expected}) ({where})"
    return None


def trl_problems(root: Path | None = None) -> list[str]:
    """One sentence per listed name that the TRL at `root` (default: the one this interpreter imports) lacks or
    changed; [] when every name holds."""
    root = root or trl_root()
    if root is None:
        return ["TRL is not installed (pip install 'trl==1.16.*')"]
    return [problem for entry in TRL_NAMES if (problem := name_problem(root, entry))]


def check_trl() -> None:
    """Raise TrlChanged, one paragraph naming every missing or changed name and the TRL found, unless all hold."""
    root = trl_root()
    problems = trl_problems(root)
    if problems:
        raise TrlChanged(
            f"the installed TRL {trl_version()} ({root}) lacks or changed what agrpo overrides and patches in TRL "
            f"{TRL_SERIES} ({len(problems)} name{'s' if len(problems) > 1 else ''}): {'; '.join(problems)}. "
            f"Nothing was started. Install it (pip install 'trl=={TRL_SERIES}.*'), or adapt agrpo to this TRL: "
            "agrpo/trl_compat.py lists each name with the module that relies on it."
        )


def require(module_name: str, attribute: str):
    """The module (imported) that holds `attribute`, for a patch of it at run time. The name must be listed in
    TRL_NAMES (so that prepare checked it); TrlChanged if this TRL lacks it all the same."""
    if not any(e.module == module_name and e.path == attribute for e in TRL_NAMES):
        raise RuntimeError(f"{module_name}.{attribute} is not in agrpo/trl_compat.py's TRL_NAMES: add it there")
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise TrlChanged(
            f"agrpo patches `{module_name}.{attribute}` (TRL {TRL_SERIES}), which the installed TRL {trl_version()} "
            f"does not have: install trl=={TRL_SERIES}.* or adapt agrpo (agrpo/trl_compat.py)"
        )
    return module
