"""The tool of the own-tool benchmark: a converter from made-up units to zorbs. The factors are this file's alone,
so an answer cannot be guessed without calling the tool with the row's own amount and unit."""

FACTORS = {"florp": 7, "quib": 13, "snark": 4, "dwib": 11, "plonk": 9, "grel": 6, "vosh": 12, "tink": 3}


def convert(amount: int, unit: str) -> str:
    """Convert an amount of a unit into zorbs.

    Args:
        amount: How many of the unit.
        unit: The unit to convert from.

    Returns:
        The amount in zorbs.
    """
    if unit not in FACTORS:
        raise ValueError(f"unknown unit {unit!r}; known units: {', '.join(sorted(FACTORS))}")
    return str(int(amount) * FACTORS[unit])
