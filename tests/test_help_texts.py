"""The help of `agrpo eval` and `agrpo plot`: whole sentences, every eval.* key of the schema with its default."""

from __future__ import annotations

import dataclasses

from agrpo.config.schema import EvalConfig


def test_eval_help_lists_every_eval_key(capsys):
    from agrpo.eval.cli import main

    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: agrpo eval +recipe=NAME [eval.adapter=PATH] [eval.k=4] [key=value ...]\n")
    assert "`" not in text.splitlines()[0]
    for field in dataclasses.fields(EvalConfig):
        assert f"eval.{field.name}=" in text, field.name
    assert "eval.k=4" in text and 'eval.split="test"' in text and "<run dir>/eval/<date_time>" in text


def test_plot_help_is_whole(capsys):
    import pytest

    from agrpo.plot import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the completion length and the step time; several runs overlaid with a legend." in text
    assert "--overwrite replace the output file if it exists" in text
