"""The warm start you can watch (issue 46): a line when the build starts, progress lines with an estimate while it
trains, and examples whose length does not grow with agent.max_tool_output_chars (a 6 MB tool made them 381 tokens
instead of 103 and the build did not finish in 15 minutes)."""

from __future__ import annotations


from agrpo.agents import warmstart_examples as ex
from tests.agents.test_warmstart import planned, task  # noqa: F401 (task: the own-tool task, a fixture)


def test_the_progress_line_estimates_what_is_left():
    assert ex.progress_line(90, 900, 30.0) == (
        "agent.warmstart: 90/900 supervised batches (10%), 30 s so far, about 4 min 30 s left"
    )
    assert ex.progress_line(900, 900, 185.0).endswith("(100%), 185 s so far, about 0 min 00 s left")


def test_an_example_shows_the_head_of_a_long_answer_whatever_the_cap():
    assert ex.example_answer("7 zorbs") == "7 zorbs"
    huge = "x" * 6_000_000
    assert ex.example_answer(huge) == "x" * ex.WARM_ANSWER_CHARS + "..."


def test_the_build_says_what_it_does_and_its_examples_ignore_the_cap(task, tiny_model_dir, capsys, monkeypatch):  # noqa: F811
    from agrpo.agents import warmstart
    from agrpo.agents.warmstart import build_warm_model, planned_spec, played

    monkeypatch.setattr(warmstart, "PROGRESS_EVERY_S", 0.0)  # a line per batch: the 6 of 2 steps
    source = (task / "units.py").read_text()
    (task / "units.py").write_text(source.replace("return str(int(amount) * FACTORS[unit])", 'return "z" * 5000'))
    cfg = planned(task, tiny_model_dir)
    uncapped = planned(task, tiny_model_dir, "agent.max_tool_output_chars=null")
    assert cfg.model.name_or_path == uncapped.model.name_or_path  # the cap is no part of the warm model
    episodes, _, _ = played(planned_spec(cfg.model))
    assert {e.output for e in episodes if e.call} == {"z" * ex.WARM_ANSWER_CHARS + "..."}  # not the cap's 64 + marker
    build_warm_model(str(cfg.model.name_or_path), cfg.model.builder_input)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("agent.warmstart: ")]
    assert lines[0].startswith("agent.warmstart: building warmstart-") and "6 supervised batches" in lines[0]
    progress = lines[1:]
    assert [line.split(" supervised")[0] for line in progress] == [f"agent.warmstart: {i}/6" for i in range(1, 7)]
    assert progress[-1].endswith("about 0 min 00 s left")
