"""trainer.attention decided by loading the kernel, not by pinging the Hub (issue 33): under auto, a kernel that does
not load (a missing build, a 403/429, a blocked download) falls back to SDPA with one line saying why, before the
first step; a forced fa3 that does not load is a ConfigError naming the failure."""

import logging

import pytest

from agrpo.config.attention_choice import AttentionChoice
from agrpo.errors import ConfigError
from agrpo.config.attention_choice import loaded_choice

FA3 = AttentionChoice("fa3", "compute capability 9.0, kernel in the cache")


def refuses(error: Exception):
    def load():
        raise error

    return load


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("no build for torch213-cxx11-cu130-x86_64-linux"),
        OSError("403 Client Error: Forbidden for url: https://huggingface.co/api/kernels-community/flash-attn3"),
        ConnectionError("Max retries exceeded (blocked)"),
    ],
)
def test_auto_falls_back_to_sdpa_with_the_reason(error, caplog):
    with caplog.at_level(logging.WARNING, logger="agrpo"):
        choice = loaded_choice(FA3, "auto", refuses(error))
    assert choice.kind == "sdpa" and type(error).__name__ in choice.reason and str(error)[:20] in choice.reason
    assert "SDPA packed attention" in choice.banner
    assert [r.getMessage() for r in caplog.records] == [
        f"FlashAttention-3 did not load ({choice.reason.removeprefix('FA3 did not load: ')}): the trainer uses SDPA"
    ]


def test_forced_fa3_that_does_not_load_is_a_config_error_naming_it():
    with pytest.raises(
        ConfigError, match=r"trainer.attention=fa3, but TRL's FlashAttention-3 kernel did not load \(OSError: 429"
    ):
        loaded_choice(FA3, "fa3", refuses(OSError("429 Too Many Requests")))


def test_a_kernel_that_loads_keeps_fa3():
    assert loaded_choice(FA3, "auto", lambda: object()) == FA3
