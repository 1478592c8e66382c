"""Field docs are readable by code (agrpo/config/schema/knobs.py): every key has one, docs/config.md is generated
from them and up to date, and `python -m agrpo --help GROUP` prints them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agrpo.config.reference import reference_markdown
from agrpo.config.schema import RunConfig, walk
from agrpo.config.schema.knobs import groups
from agrpo.help import main_help
from agrpo.paths import CONF_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_key_has_a_doc():
    missing = [knob.key for knob in walk(RunConfig) if len(knob.doc) < 10]
    assert missing == []


def test_every_group_has_its_own_docstring():
    """Not the one @dataclass writes ("ModelConfig(name_or_path: str = ...)"): --help and docs/config.md show it."""
    for prefix, schema in groups(RunConfig):
        doc = (schema.__doc__ or "").strip()
        assert doc and not doc.startswith(f"{schema.__name__}("), prefix or "top level"


def test_docs_config_md_is_generated_from_the_schema():
    expected = reference_markdown()
    assert (REPO_ROOT / "docs" / "config.md").read_text() == expected, (
        "docs/config.md is out of date: run `make docs` (python -m agrpo.config.reference > docs/config.md)"
    )
    for knob in walk(RunConfig):
        assert f"| `{knob.key}` |" in expected, knob.key
    assert "| `sync.mode` | one of: background, blocking | `background` |" in expected
    assert '| `eval.split` | str | `"test"` |' in expected


def test_the_reference_follows_a_changed_schema():
    """The generator reads the classes it is given: a new knob shows up with its doc and default."""
    from agrpo.config.schema import knob

    @dataclasses.dataclass
    class Extra:
        """A group for this test."""

        speed: int = knob(3, doc="How fast, in this test's units.")

    text = reference_markdown(Extra)
    assert "| `speed` | int | `3` | How fast, in this test's units. |" in text


def test_help_group_prints_its_keys_defaults_choices_and_docs(capsys):
    assert main_help(Path(CONF_DIR), ["--help", "sync"]) == 0
    text = capsys.readouterr().out
    keys = [knob.key for knob in walk(RunConfig) if knob.key.startswith("sync.")]
    for key in keys:
        assert f"\n{key}=" in f"\n{text}", key
    assert "sync.mode=background  (background | blocking)" in text
    assert "blocking: TRL's pause -> save -> load -> resume" in " ".join(text.split())
    assert "trainer." not in text


def test_help_names_the_groups_when_a_topic_is_unknown(capsys):
    assert main_help(Path(CONF_DIR), ["--help", "trainr"]) == 2
    err = capsys.readouterr().err
    assert "no config key or group named 'trainr'" in err and "trainer" in err


def test_plain_help_lists_the_key_groups(capsys):
    assert main_help(Path(CONF_DIR), ["+recipe=smoke", "--help"]) == 0  # an override is not a topic
    text = capsys.readouterr().out
    assert "Keys by group" in text and "launcher.hf_jobs" in text and "docs/config.md" in text
