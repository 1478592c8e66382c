"""Why a tool call TRL could not parse was not parsed (agrpo/agents/malformed.py; issue 46: 25-27 such replies a run
and nothing said why), counted per step under its reason and named in the end-of-run line."""

from __future__ import annotations

import re

import pytest

from agrpo.agents.malformed import REASON_KEYS, malformed_reason, reason_key, reasons_part
from agrpo.agents.metrics import agent_summary, summary_line

OPENER = re.compile(re.escape("<tool_call>"))


@pytest.mark.parametrize(
    "text,reason",
    [
        ('<tool_call>\n{"name": "get_secret", "arguments": {"play', "length"),  # stopped at max_completion_length
        ('<tool_call>\n{"name": "get_secret", "arguments": {"player": "Ada"}<|im_end|>', "cut"),  # turn ended in it
        ('<tool_call>\n{"name": "get_secret", "arguments": {"player": "Ada"}<|eot_id|>\n', "cut"),
        # replies of the own tool task's trained policy (docs/your_agent.md, "Unparseable calls"), as sampled
        ('<tool_call>\n{"name": "convert", "arguments": {"amount": 9, "unit": "24<|im_end|>', "cut"),
        ('<tool_call>\n{"name": "convert", "arguments": {"amount": 6, "unit": "}}\n</tool_call><|im_end|>', "json"),
        ('<tool_call>\n{"name": "convert"unit": "snark"}}\n</tool_call><|im_end|>', "json"),
        (
            '<tool_call>\n<tool_call>\n{"name": "convert", "arguments": {"amount": 5, "unit": "plonk"}}\n</tool_call>',
            "json",
        ),
        ('<tool_call>\n{"name": "get_secret", "arguments": {"player": Ada}}\n</tool_call>', "json"),
        ('<tool_call>\n{"tool": "get_secret"}\n</tool_call>', "shape"),
        ('<tool_call>\n{"name": "get_secret", "arguments": "Ada"}\n</tool_call>', "shape"),
        ('<tool_call>\n{"name": "get_secret", "arguments": {}}\n</tool_call>', "other"),
    ],
)
def test_each_reply_gets_one_reason(text, reason):
    assert malformed_reason(text, OPENER) == reason


def test_the_reasons_reach_the_run_summary():
    history = [
        {
            "agent/episodes_total": 16.0,
            "tools/malformed_call_total": 3.0,
            reason_key("cut"): 2.0,
            reason_key("json"): 1.0,
        },
        {
            "agent/episodes_total": 16.0,
            "tools/malformed_call_total": 1.0,
            reason_key("cut"): 1.0,
            reason_key("json"): 0.0,
        },
    ]
    figures = agent_summary(history)
    assert figures[reason_key("cut")] == 3.0 and figures[reason_key("shape")] == 0.0 and len(REASON_KEYS) == 5
    assert reasons_part(figures) == " (cut 3, json 1)"
    assert "4 replies with a tool call TRL could not parse (cut 3, json 1)" in summary_line(figures)
