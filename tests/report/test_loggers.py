"""`logger_problems`: what stops a metric sink from starting, with the command that fixes it; the config options."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from agrpo.report.loggers import logger_problems, module_installed


def only(*names):
    return lambda module: module in names


def test_installed_sinks_have_no_problem():
    assert logger_problems(["tensorboard"], only("tensorboard")) == []
    assert logger_problems(["tensorboard"], only("tensorboardX")) == []  # transformers accepts either
    assert logger_problems(["tensorboard", "wandb", "trackio"], only("tensorboard", "wandb", "trackio")) == []
    assert logger_problems([], only()) == [] and logger_problems(["none"], only()) == []


def test_each_missing_package_gets_its_pip_command():
    problems = logger_problems(["tensorboard", "trackio", "wandb", "comet_ml"], only("tensorboard"))
    assert problems == [
        "logger.report_to includes 'trackio' but the trackio package is not installed: pip install trackio",
        "logger.report_to includes 'wandb' but the wandb package is not installed: pip install wandb",
        "logger.report_to includes 'comet_ml' but the comet-ml package is not installed: pip install comet-ml",
    ]


def test_unknown_sinks_and_ambiguous_lists_are_named():
    problems = logger_problems(["tensorbord", "none", "all"], only("tensorboard"))
    assert any("unknown sink 'tensorbord'" in p and "tensorboard" in p for p in problems)
    assert any("mixes 'none'" in p for p in problems) and any("[all]" in p for p in problems)


def test_this_environment_matches_what_python_can_import():
    assert module_installed("json") and not module_installed("agrpo_no_such_module")
    expected = (
        []
        if module_installed("trackio")
        else ["logger.report_to includes 'trackio' but the trackio package is not installed: pip install trackio"]
    )
    assert logger_problems(["trackio"]) == expected


def test_logger_options_compose(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for option, sinks in (
        ("logger=trackio", ["trackio"]),
        ("logger=wandb", ["wandb"]),
        ("logger.report_to=[tensorboard,wandb]", ["tensorboard", "wandb"]),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "agrpo", "+recipe=smoke", option, "--cfg", "job"],
            check=False,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        logger = yaml.safe_load(result.stdout)["logger"]
        assert logger["report_to"] == sinks and logger["console_every"] == 10 and logger["level"] == "INFO"
