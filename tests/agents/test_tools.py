"""Tools from config as TRL takes them (agrpo/agents/tools.py): the schema the model sees, the pickle trip into a
spawned process, and bad tools (raising, hanging, unserialisable, unknown) run through the rollout loop's tool
execution (agrpo/trainer/rollout/toolbox.py)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle

import pytest
from transformers.utils import get_json_schema

from agrpo.agents.tools import GuardedTool, build_tools, load_target
from agrpo.errors import ConfigError


def call(tool, kwargs):
    """Runs in a spawned process, as TRL's rollout worker does."""
    return tool.__name__, tool(**kwargs)


def test_a_file_tool_shows_its_own_schema_and_survives_a_spawned_process(user_code):
    tool = GuardedTool("my_tools.py:search")
    original = load_target("my_tools.py:search")
    assert tool.method.__name__ == "search"
    served = get_json_schema(original)
    assert served["function"].pop("return") == {"type": "string"}  # the return hint: no key of OpenAI's tool format
    assert get_json_schema(tool.method) == served
    assert get_json_schema(tool.method)["function"]["parameters"]["required"] == ["query"]
    restored = pickle.loads(pickle.dumps(tool.method))
    assert restored(query="cats") == "3 notes about cats"
    with mp.get_context("spawn").Pool(1) as pool:  # TRL's rollout process is spawned the same way
        assert pool.apply(call, (tool.method, {"query": "dogs"})) == ("search", "3 notes about dogs")


def test_bound_options_leave_the_schema_and_reach_the_call(user_code):
    tool = GuardedTool("my_tools.search", {"limit": 5})  # a dotted path into the working directory
    assert set(get_json_schema(tool.method)["function"]["parameters"]["properties"]) == {"query"}
    assert tool.method(query="owls") == "5 notes about owls"
    with pytest.raises(TypeError, match="takes no option"):
        GuardedTool("my_tools.py:search", {"limt": 5})


def test_async_tools_run_in_a_worker_thread(user_code):
    (add,) = build_tools(["my_tools.py:add"], timeout_s=5)
    assert add.method(a=2, b=3) == 5


def test_a_tool_that_does_not_load_names_its_entry(user_code):
    with pytest.raises(ConfigError, match=r"agent.tools\[1\]='nowhere.py:search' cannot be loaded"):
        build_tools(["my_tools.py:search", "nowhere.py:search"], timeout_s=None)
    with pytest.raises(ConfigError, match=r"agent.tools\[0\].*mapping with `_target_`"):
        build_tools([{"name": "search"}], timeout_s=None)


def test_bad_tools_end_their_turn_with_an_error_the_model_sees_and_are_counted(user_code, rollout_loop):
    """The loop's `Toolbox.call` on one turn calling a good tool, a raising one, a hung one, one returning an
    object, and a name that does not exist: every call answers, the run goes on, each failure is counted."""
    tools = build_tools(["my_tools.py:" + n for n in ("search", "broken", "stuck", "opaque")], timeout_s=0.5)
    methods = [tool.method for tool in tools]
    loop = rollout_loop(tools=methods)
    calls = [
        {"function": {"name": name, "arguments": {"query": "q"}}}
        for name in ("search", "broken", "stuck", "opaque", "missing")
    ]
    messages, n_calls, n_failures = asyncio.run(loop.toolbox.call(calls, loop.toolbox.callable_tools(None)))
    answers = {m["name"]: m["content"] for m in messages}
    assert (n_calls, n_failures) == (5, 4)
    assert answers["search"] == "3 notes about q"
    assert "the index is down" in answers["broken"]
    assert "did not return within 0.5 s (agent.tool_timeout_s)" in answers["stuck"]
    assert "returned a dict, which a tool message cannot carry" in answers["opaque"]
    assert "unknown tool missing" in answers["missing"]
    assert [m["role"] for m in messages] == ["tool"] * 5  # in the calls' order
    assert [m["name"] for m in messages] == ["search", "broken", "stuck", "opaque", "missing"]
    counters = loop.figures.counters
    for name in ("broken", "stuck", "opaque", "missing"):
        assert counters[f"tools/{name}/failure_total"] == 1 and counters[f"tools/{name}/call_total"] == 1
    assert counters["tools/search/failure_total"] == 0 and counters["tools/search/call_total"] == 1
    assert counters["tools/unknown_name_total"] == 1  # the hallucinated name, apart from the tools that failed


def test_the_schema_has_no_return_key_as_vllm_chat_api_serves_none(user_code):
    """vLLM's chat API drops a tool's `return` (OpenAI's format has none), so training must not render one either:
    otherwise a served request lists the tools in other words than the prompts the adapter learnt on."""
    from agrpo.agents.environments import guarded_class
    from agrpo.agents.secret_word import SecretWordEnv
    from agrpo.agents.tools import served_doc

    doc = "Find.\n\n    Returns:\n        a thing,\n        on two lines\n\n    Args:\n        q: query\n    "
    assert served_doc(doc) == "Find.\n\n    Args:\n        q: query\n    "
    assert served_doc("No sections.") == "No sections." and served_doc(None) is None
    method = guarded_class(SecretWordEnv, 5.0).get_secret
    assert "return" not in get_json_schema(method)["function"]
    assert SecretWordEnv.get_secret.__annotations__["return"] == "str"  # the user's class is left as it was
