"""Run by torchrun from test_accelerate_fsdp.py: torch FSDP2 over gloo on CPU, on a tiny tied Qwen2.

Prints one line per case: the refusal FSDP2 gives a tied head in its own group, and a forward/backward after
agrpo's untie_embeddings."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from tiny_qwen2 import tiny_qwen2

from agrpo.trainer.seam.fsdp_compat import untie_embeddings


def say(line: str) -> None:
    """One write per line: both ranks share the pipe, and print() writes the text and the newline separately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def shard(model):
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.lm_head)
    fully_shard(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item()


dist.init_process_group("gloo")
try:
    shard(tiny_qwen2(tied=True))
    say("tied: ok")
except ValueError as error:
    say(f"tied: refused: {error}")
model = tiny_qwen2(tied=True)
untie_embeddings(model)
say(f"untied: loss {shard(model):.4f}")
# Without it, a rank that finishes first tears the group down under the other one, which then aborts
# ("terminate called without an active exception"): half the runs failed on this 2-core machine.
dist.barrier()
# Then leave without tearing gloo down at all: destroy_process_group and the interpreter's exit still aborted rank 0
# the same way once CI's other lane held the cores (2026-12-04, every line already printed). Each rank's last message
# of the barrier was sent before it returned, so neither rank is left waiting.
sys.stdout.flush()
os._exit(0)
