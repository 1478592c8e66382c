"""Metric sinks (`logger.report_to`, TRL/transformers' `report_to`) checked before anything starts.

`logger_problems` is pure: for each name it says what is wrong (an unknown sink, or a missing package with the pip
command that installs it). The caller decides how to report them (validation raises one ConfigError with them all).
Offline use (docs/console.md): TensorBoard writes local event files; trackio is local-first (its dashboard is
`trackio show`, nothing leaves the machine unless TRACKIO_SPACE_ID names a Space); wandb needs WANDB_MODE=offline
(runs are synced later with `wandb sync`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable

# Sink name (as transformers spells it) -> (importable modules, any one suffices; pip requirement that installs one).
SINKS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "trackio": (("trackio",), "trackio"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow",), "mlflow"),
    "comet_ml": (("comet_ml",), "comet-ml"),
    "neptune": (("neptune",), "neptune"),
    "clearml": (("clearml",), "clearml"),
    "dvclive": (("dvclive",), "dvclive"),
    "swanlab": (("swanlab",), "swanlab"),
    "codecarbon": (("codecarbon",), "codecarbon"),
    "azure_ml": (("azureml",), "azureml-core"),
    "dagshub": (("dagshub", "mlflow"), "dagshub mlflow"),
    "flyte": (("flytekit",), "flytekit"),
    "kubeflow": (("kubeflow",), "kubeflow-training"),
}
NO_SINK = "none"  # transformers' spelling for "log nowhere"


def module_installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def logger_problems(report_to: Iterable[str], installed: Callable[[str], bool] = module_installed) -> list[str]:
    """One sentence per problem in `report_to`; an empty list when every sink can start."""
    names = [str(name) for name in report_to]
    problems: list[str] = []
    if NO_SINK in names and len(names) > 1:
        problems.append(f"logger.report_to={names} mixes 'none' with sinks: use [] or 'none' alone to log nowhere")
    if "all" in names:
        problems.append(
            "logger.report_to=[all] would start every installed integration: name the sinks you want, "
            f"e.g. [tensorboard,wandb] (known: {', '.join(SINKS)})"
        )
    for name in names:
        if name in (NO_SINK, "all"):
            continue
        if name not in SINKS:
            problems.append(f"logger.report_to: unknown sink {name!r} (known: {', '.join(SINKS)})")
            continue
        modules, requirement = SINKS[name]
        if not any(installed(module) for module in modules):
            problems.append(
                f"logger.report_to includes {name!r} but the {requirement.split()[0]} package is not "
                f"installed: pip install {requirement}"
            )
    return problems
