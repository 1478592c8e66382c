"""Prompts as routing sees them: canonical bytes or text, cut into hashed blocks.

A token prompt is kept as the canonical bytes of its ids (``b"1,2,3"``, no spaces), taken
straight from the request body: hashing those bytes costs a fraction of parsing them into
ints. A text prompt (or a chat conversation, flattened) is kept as text and cut into blocks
of ``block_size * text_chars_per_token`` characters. Either way a prompt has *units* (tokens or
characters), and the key of its first ``u`` units is ``hash((seed, data[:end(u)]))``, so the key
of a whole earlier prompt equals the key of the same prefix inside a longer continuation.
"""

import numpy as np

_COMMA = ord(",")


class Prompt:
    """One prompt of a request; computes its block chain lazily (only cold requests need it)."""

    __slots__ = ("data", "is_tokens", "units", "_commas", "_chain")

    def __init__(self, data: bytes | str, is_tokens: bool):
        self.data = data
        self.is_tokens = is_tokens
        if is_tokens:
            self.units = data.count(b",") + 1 if data else 0
        else:
            self.units = len(data)
        self._commas = None
        self._chain = None

    @classmethod
    def from_token_ids(cls, ids) -> "Prompt":
        """Build from a list of ints (tests, fallbacks); same bytes as the fast path."""
        return cls(",".join(str(int(t)) for t in ids).encode("ascii"), True)

    @classmethod
    def from_text(cls, text: str) -> "Prompt":
        return cls(text, False)

    def tokens(self, chars_per_token: int) -> int:
        """Token count (exact for ids, estimated for text), for load accounting."""
        if self.is_tokens:
            return self.units
        return -(-self.units // chars_per_token)

    def end(self, units: int) -> int:
        """Offset in `data` where the first `units` units end (exclusive)."""
        if units >= self.units:
            return len(self.data)
        if not self.is_tokens or units <= 0:
            return max(units, 0)
        if self._commas is None:
            self._commas = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == _COMMA)
        return int(self._commas[units - 1])

    def key(self, seed: int) -> int:
        """Key of the whole prompt under an adapter seed."""
        return hash((seed, self.data))

    def prefix_key(self, seed: int, units: int) -> int:
        """Key of the first `units` units; equals `key` of a prompt made of exactly those."""
        return hash((seed, self.data[: self.end(units)]))

    def chain(self, seed: int, block_units: int) -> list[int]:
        """Chained hashes of the full blocks: chain[j] covers units [0, j * block_units).

        chain[0] is the seed itself, so a prompt shorter than one block still has an anchor.
        """
        if self._chain is not None and self._chain[0] == seed:
            return self._chain
        full_blocks = self.units // block_units
        hashes = [seed]
        data = self.data
        h = seed
        if self.is_tokens:
            if full_blocks:
                ends = self._block_ends(block_units, full_blocks)
                start = 0
                for stop in ends:
                    h = hash((h, data[start:stop]))
                    hashes.append(h)
                    start = stop + 1  # skip the comma between blocks
        else:
            for j in range(full_blocks):
                h = hash((h, data[j * block_units : (j + 1) * block_units]))
                hashes.append(h)
        self._chain = hashes
        return hashes

    def _block_ends(self, block_units: int, full_blocks: int) -> list[int]:
        if self._commas is None:
            self._commas = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == _COMMA)
        ends = self._commas[block_units - 1 :: block_units].tolist()[:full_blocks]
        if len(ends) < full_blocks:  # the last block ends the prompt: no comma after it
            ends.append(len(self.data))
        return ends


def conversation_text(messages) -> str:
    """Flatten chat messages so that an earlier conversation is a prefix of its continuation."""
    if not isinstance(messages, list):
        return repr(messages)
    parts = []
    for message in messages:
        if isinstance(message, dict):
            content = message.get("content")
            if not isinstance(content, str):
                content = repr(content)
            parts.append(f"{message.get('role')}\x1f{content}\x1e")
        else:
            parts.append(f"{message!r}\x1e")
    return "".join(parts)
