"""The launchers, the trainer, eval and the proxy take the typed run spec (agrpo/config/spec.py), never an untyped
config: every parameter that holds the run's config or one of its groups is annotated with the schema's class.

Read from source with ast (nothing is imported). A config parameter is one named `cfg` or `*_cfg`, or after a group
(`inference`, `ev` for eval, `settings` for the proxy's own): it must name a class of the schema (RunConfig or one of
its groups), not `Any`, nor nothing. Layers below
agrpo/config (data, rewards, agents, sync, models) cannot import the schema without an import cycle, and serve the
validation pass's composed config too; they are not held to this.
"""

from __future__ import annotations

import ast
from pathlib import Path

from agrpo.config.schema import RunConfig
from agrpo.config.schema.knobs import groups

AGRPO = Path(__file__).resolve().parents[1] / "agrpo"
CHECKED = ("launchers", "trainer", "eval", "proxy", "inference", "fleet", "report")
GROUP_PARAMS = {"cfg", "inference", "ev", "settings"}
SCHEMA_CLASSES = {schema.__name__ for _, schema in groups(RunConfig)}


def is_config_param(name: str) -> bool:
    return name in GROUP_PARAMS or name.endswith("_cfg")


def annotation_name(node: ast.expr | None) -> str | None:
    """The class an annotation names (`RunConfig`, `"RunConfig"`, `schema.RunConfig`), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def untyped_config_params(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(function, parameter, line) of every config parameter not annotated with a schema class."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if is_config_param(arg.arg) and annotation_name(arg.annotation) not in SCHEMA_CLASSES:
                found.append((node.name, arg.arg, arg.lineno))
    return found


def test_every_config_parameter_is_the_typed_spec():
    found = []
    for folder in CHECKED:
        for path in sorted((AGRPO / folder).rglob("*.py")):
            found += [
                f"{path.relative_to(AGRPO.parent)}:{line} {fn}({arg})"
                for fn, arg, line in untyped_config_params(ast.parse(path.read_text()))
            ]
    assert found == []


def test_the_finder_sees_untyped_any_and_typed_parameters():
    tree = ast.parse(
        "def a(cfg): ...\n"
        "def b(cfg: Any, model_cfg: 'ModelConfig'): ...\n"
        "class C:\n    def m(self, inference: dict, trainer: Any, cfg: RunConfig): ...\n"
    )
    assert untyped_config_params(tree) == [("a", "cfg", 1), ("b", "cfg", 2), ("m", "inference", 4)]
