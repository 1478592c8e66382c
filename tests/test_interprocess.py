"""The boundary every inter-process read goes through (agrpo/interprocess.py), fed garbage by hypothesis: arbitrary
JSON values, arbitrary bytes, NaN/inf, huge numbers, truncated lines. It never raises, counts every bad line, and
keeps every good one in order."""

from __future__ import annotations

import json
import logging
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agrpo.fleet.signals import STEP_KEYS
from agrpo.interprocess import (
    PROXY_STATS,
    RUN_METRICS,
    BadInput,
    Skipped,
    answer_record,
    numbers,
    parse_json,
    parse_lines,
    parse_record,
    read_metrics,
)
from agrpo.trainer.console.serving_metrics import proxy_figures

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
good_steps = st.dictionaries(
    st.sampled_from(("t", "step", *STEP_KEYS)),
    st.floats(min_value=0, max_value=1e9) | st.integers(min_value=0, max_value=10**9),
    max_size=6,
)


def _truncated(entry: dict) -> bytes:
    text = json.dumps({"perf/step_s": 1.5, **entry})
    return text[: len(text) // 2].encode()  # a strict prefix of an object is never JSON


bad_lines = st.one_of(
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    good_steps.map(_truncated),
    st.sampled_from([b"NaN", b"1e999", b'"x"', b"null", b"[1]", b'{"perf/step_s": NaN}', b'{"step": 1e999}']),
    st.sampled_from([b'{"perf/step_s": "x"}', b'{"step": true}', b'{"step": -1}', b'{"t": 1' + b"0" * 400 + b"}"]),
    st.binary(max_size=40).map(lambda b: b"\xff" + b.replace(b"\n", b" ")),  # never UTF-8
)


@FAST
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_or_json_value_is_a_record_or_a_reason_never_an_exception(data):
    for check in (numbers, PROXY_STATS, RUN_METRICS):
        try:
            parse_record(data, check)
        except BadInput as error:
            assert str(error)  # a reason in words


@FAST
@given(st.lists(st.tuples(st.booleans(), good_steps, bad_lines), max_size=12))
def test_bad_lines_are_skipped_and_counted_good_ones_kept_in_order(mixed):
    lines = [json.dumps(good).encode() if keep else bad for keep, good, bad in mixed]
    skipped = Skipped()
    entries = parse_lines(b"\n".join(lines), numbers, "steps.jsonl", skipped)
    assert entries == [{k: float(v) for k, v in good.items()} for keep, good, _ in mixed if keep]
    assert skipped.total == sum(1 for keep, _, _ in mixed if not keep)
    assert all(math.isfinite(v) and v >= 0 for entry in entries for v in entry.values())


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"[1]", "the record is an array, not an object"),
        (b"NaN", "NaN is not a finite number"),
        (b"1e999", "1e999 is not a finite number"),
        (b'"x"', "the record is a string, not an object"),
        (b"null", "the record is null, not an object"),
        (b'{"perf/step_s": 1.', "not JSON"),
        (b'{"perf/step_s": "x"}', "perf/step_s is a string, not a number"),
        (b'{"step": 1' + b"0" * 20 + b"}", "step is 1" + "0" * 20 + ", not a finite number within 1e+15"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100_000, "not JSON"),  # nested too deep for the parser
    ],
)
def test_each_kind_of_bad_line_is_rejected_with_its_reason(line, reason):
    with pytest.raises(BadInput) as caught:
        parse_record(line, numbers)
    assert str(caught.value).startswith(reason)


def test_the_first_bad_line_of_a_source_is_logged_once_and_the_rest_counted(caplog):
    skipped = Skipped()
    with caplog.at_level(logging.WARNING, logger="agrpo.interprocess"):
        parse_lines(b'{"step": 1}\n[1]\nNaN\n{"step": 2}\nnull\n', numbers, "steps.jsonl", skipped, first_line=7)
    assert skipped.counts == {"steps.jsonl": 3} and skipped.summary() == "3 bad input(s) skipped in steps.jsonl"
    assert [r.getMessage() for r in caplog.records] == [
        "skipped a bad input in steps.jsonl line 8: the record is an array, not an object (later ones are only counted)"
    ]


@FAST
@given(json_values | st.fixed_dictionaries({"routed": json_values, "replicas": st.lists(json_values, max_size=3)}))
def test_a_garbage_proxy_stats_answer_is_counted_and_its_figures_never_raise(stats):
    skipped = Skipped()
    typed = answer_record(json.dumps(stats).encode(), PROXY_STATS, "proxy", skipped, default=None)
    assert (typed is None) == (skipped.total == 1)
    if typed is not None:
        assert all(math.isfinite(v) for v in proxy_figures(typed).values())


def test_metrics_json_reads_nan_as_null_and_a_bad_file_as_none(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"reward_last": NaN, "reward_first": -0.5, "global_step": 3, "rewards": [1.0, Infinity]}')
    assert read_metrics(path) == {"reward_first": -0.5, "global_step": 3, "rewards": [1.0, None]}  # NaN: no reward
    path.write_text("[1]")
    skipped = Skipped()
    assert read_metrics(path, skipped) == {} and skipped.counts == {str(path): 1}
    assert read_metrics(tmp_path / "none.json", skipped) == {} and skipped.total == 1  # missing is not bad


def test_json_accepts_only_finite_numbers():
    assert parse_json(b'{"a": 1.5, "b": [2, -3e2]}') == {"a": 1.5, "b": [2, -300.0]}
    for text in ("Infinity", "-Infinity", "[NaN]", "1e400"):
        with pytest.raises(BadInput):
            parse_json(text)
