"""argparse types for the command line's numeric options: each refuses a value out of range
with a message that names the range."""

from __future__ import annotations

import argparse

__all__ = ["concurrency_list", "duration", "non_negative_int", "positive_float", "positive_int"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def concurrency_list(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 1,16,64, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1: {text!r}")
    return levels


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h`` or ``1d``: more than 0."""
    number, unit = (text[:-1], text[-1]) if text[-1:].lower() in _UNITS else (text, "s")
    try:
        value = float(number) * _UNITS[unit.lower()]
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a duration such as 90s, 15m, 2h or 1d, not {text!r}"
        )
    return value
