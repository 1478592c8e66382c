"""Write the own-tool benchmark's rows: `python make_data.py [DIR]` -> DIR/train.jsonl (120 rows) and test.jsonl (40).

Each row asks how many zorbs an amount of a made-up unit is; `answer` is the tool's result, `amount` and `unit` are
the values the prompt states (agent.warmstart.arguments reads them)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from units import FACTORS

ASKS = ("How many zorbs is {amount} {unit}?", "Convert {amount} {unit} to zorbs.", "{amount} {unit} in zorbs?")


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        amount, unit = rng.randrange(2, 10), rng.choice(sorted(FACTORS))
        prompt = rng.choice(ASKS).format(amount=amount, unit=unit)
        made.append({"prompt": prompt, "amount": amount, "unit": unit, "answer": amount * FACTORS[unit]})
    return made


def main(folder: str = ".") -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("train", 120, 0), ("test", 40, 1)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows(count, seed)))
    print(f"wrote {out / 'train.jsonl'} and {out / 'test.jsonl'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
