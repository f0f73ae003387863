"""The ``hasher`` scenario: ``idemstore.fingerprint`` against ``rfc8785`` and
``json.dumps(sort_keys=True)`` (each + SHA-256) on tool-call arguments of three realistic
shapes (a mixed call, a float-heavy one and a Unicode-heavy one) and on three of arbitrary
values from ``arbitrary_values`` (doubles of every exponent, strings of every code point, a
random nest of every type). Each measurement's notes say which pass of ``idemstore.hashing``
ran (``IDEMSTORE_PURE_PYTHON=1`` times the pure-Python one)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
import time
from typing import TYPE_CHECKING, Any

from idemstore.bench.arbitrary_values import ARBITRARY_SHAPES
from idemstore.bench.results import Measurement, Timing
from idemstore.bench.scenarios import keep_going, merge, rounds_of
from idemstore.hashing import COMPILED, fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.bench.scenarios import Load

__all__ = ["HASHER_FLOOR", "SHAPES", "float_value", "hasher_value", "run_hasher", "unicode_value"]


def hasher_value(size: int) -> dict[str, Any]:
    """Tool-call arguments of about ``size`` bytes of JSON, built deterministically.

    The base is a small ``charge_card`` call; past it, order lines are added until the JSON is
    ``size`` bytes, each shaped like a real API object: non-ASCII text (accents, CJK, emoji),
    quotes and newlines to escape, ints, prices and coordinates as floats, integral and tiny
    floats, nulls, booleans, nested objects and arrays, keys with accents, and on every tenth
    line emoji keys (which sort by UTF-16 code units, not code points) and a tiny float (which
    ECMAScript and ``repr`` lay out differently). Every value stays in
    RFC 8785's domain (no integer beyond 2**53), so ``rfc8785`` can hash it too.
    """
    value: dict[str, Any] = {
        "name": "charge_card",
        "arguments": {
            "order_id": 42,
            "amount": 1999,
            "currency": "EUR",
            "captured": True,
            "rate": 0.25,
            "customer": {"id": "cus_8f14e45f", "email": "zoë@example.com", "tags": ["vip"]},
            "items": [],
            "note": "Lieferung bis Freitag, bitte klingeln 🚪",
        },
    }
    items: list[dict[str, Any]] = value["arguments"]["items"]
    rng = random.Random(size)
    while len(json.dumps(value)) < size:
        items.append(_order_line(rng, len(items)))
    return value


_TITLES = (
    "Kaffeebohnen, 1 kg — Röstung „mittel“",
    "抹茶ラテ\uff08無糖\uff09",  # fullwidth parentheses
    'Café crème "Grand Cru" ☕',
    "Pão de queijo congelado",
    "Смесь орехов и сухофруктов",
    "Ørret-filet, røkt",
    "Brötchen mit Kürbiskernen 🎃",
    "Spicy ramen 🍜 (extra hot)",
)
_COLOURS = ("dunkelblau", "rot", "grün", "weiß", "naturfarben")


def _order_line(rng: random.Random, n: int) -> dict[str, Any]:
    line: dict[str, Any] = {
        "sku": f"SKU-{n:05d}",
        "title": rng.choice(_TITLES),
        "qty": rng.randint(1, 12),
        "unit_price": rng.choice((round(rng.uniform(0.5, 250), 2), float(rng.randint(1, 40)))),
        "discount": rng.choice((None, 0.1, 0.15)),
        "tax": {"rate": rng.choice((0.19, 0.07, 0.2)), "included": rng.random() < 0.5},
        "dimensions_cm": [round(rng.uniform(1, 60), 1) for _ in range(3)],
        "weight_kg": round(rng.uniform(0.05, 12), 3),
        "attributes": {"größe": rng.choice("SMLX"), "farbe": rng.choice(_COLOURS)},
        "warehouse": {
            "id": f"wh_{rng.randrange(16**8):08x}",
            "location": [round(rng.uniform(-60, 70), 6), round(rng.uniform(-180, 180), 6)],
            "stock": rng.randint(0, 50_000),
        },
        "tags": rng.sample(["gift", "fragile", "bio", "vegan", "sale", "neu"], k=2),
        "updated_ms": 1_764_500_000_000 + rng.randrange(10**9),
        "note": rng.choice((None, 'Bitte "vorsichtig" behandeln.\nDanke!', "\tam Tor abgeben")),
    }
    if n % 10 == 9:
        line["reactions"] = {"👍": rng.randint(1, 9), "ok": 1, "\uff01": rng.randint(0, 3)}
        line["tolerance"] = rng.choice((1e-05, 2.5e-7))
    return line


def float_value(size: int) -> dict[str, Any]:
    """Float-heavy tool-call arguments of about ``size`` bytes of JSON: readings of a sensor
    batch, as embeddings, measurements, coordinates and scientific constants come, of every
    magnitude ECMAScript lays out differently from ``repr`` (below 1e-4, from 1e16, integral)."""
    value: dict[str, Any] = {
        "name": "store_readings",
        "arguments": {"batch": 7, "scale": 1.0, "offset": -0.5, "readings": []},
    }
    readings: list[dict[str, Any]] = value["arguments"]["readings"]
    rng = random.Random(size)
    while len(json.dumps(value)) < size:
        readings.append(
            {
                "t": 1_764_500_000.0 + rng.randrange(10**6) / 1000,
                "v": [rng.gauss(0, 0.2) for _ in range(4)],
                "mean": round(rng.uniform(-40, 40), 2),
                "count": float(rng.randint(0, 5000)),
                "stderr": rng.uniform(1, 10) * 10.0 ** rng.randint(-12, -5),
                "flux": rng.uniform(1, 10) * 10.0 ** rng.randint(15, 25),
                "pos": [round(rng.uniform(-90, 90), 6), round(rng.uniform(-180, 180), 6)],
            }
        )
    return value


_SCRIPTS = (
    "Grüße aus München \u2013 „schön“",
    "東京都渋谷区神南一丁目、配送は午前中希望",
    "Привет, доставка до пятницы",
    "مرحبا، التسليم يوم الجمعة",
    "नमस्ते, शुक्रवार तक डिलीवरी",
    "안녕하세요 금요일까지 배송",
    "🎉🚚📦 ünterwegs 😀 \U0001d49c\U0001d4c1\U0001d4c5\U0001d4bd\U0001d4b6",
    "Ελληνικά: παράδοση την Παρασκευή",
)
_UNICODE_KEYS = ("名前", "größe", "ключ", "📦", "\U0001d49c", "\uff01", "é", "x")


def unicode_value(size: int) -> dict[str, Any]:
    """Unicode-heavy tool-call arguments of about ``size`` bytes of JSON: messages in many
    scripts with emoji, under non-ASCII keys, some past U+FFFF (which RFC 8785 sorts by
    UTF-16 code units), and a few quotes and newlines to escape."""
    value: dict[str, Any] = {
        "name": "send_messages",
        "arguments": {"channel": "général", "messages": []},
    }
    messages: list[dict[str, Any]] = value["arguments"]["messages"]
    rng = random.Random(size)
    while len(json.dumps(value, ensure_ascii=False).encode()) < size:
        keys = rng.sample(_UNICODE_KEYS, k=4)
        message: dict[str, Any] = {k: rng.choice(_SCRIPTS) for k in keys}
        message["text"] = " ".join(rng.sample(_SCRIPTS, k=3)) + rng.choice(("", '\n"ok"'))
        message["author"] = rng.choice(("Zoë", "José", "Åsa", "Łukasz", "李雷", "😀"))
        messages.append(message)
    return value


# The argument shapes each hasher is timed on: the realistic mixed call, the two kinds of
# value where JCS differs most from what the C encoder writes, and arbitrary values of those
# kinds (what a caller may send, not what one usually does).
SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "mixed": hasher_value,
    "float": float_value,
    "unicode": unicode_value,
    **ARBITRARY_SHAPES,
}


def _rfc8785_hash(value: Any) -> str:
    import rfc8785

    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def _sorted_json_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Labels short enough for the 80-column table: idemstore.fingerprint, rfc8785.canonicalize
# + SHA-256, json.dumps(sort_keys=True) + SHA-256.
HASHERS: dict[str, Callable[[Any], str]] = {
    "fingerprint": fingerprint,
    "rfc8785": _rfc8785_hash,
    "sorted json": _sorted_json_hash,
}
HASHER_FLOOR = "sorted json"


# Calls timed per clock reading. Timing calls one by one put a timer read (~0.1 us) in every
# sample and left the pooled samples bimodal on a shared VM: the p50 ratio of one committed
# run moved by 30% while its ops/s ratio stayed put. A sample is its batch's mean per call.
_BATCH = 16


def _time_sync(call: Callable[[], object], load: Load) -> Timing:
    timing = Timing()
    clock = time.perf_counter_ns
    latencies = timing.latencies_ns
    deadline = None if load.duration is None else time.monotonic() + load.duration
    count = load.ops
    started = time.perf_counter()
    j = 0
    while keep_going(j, count, deadline):
        batch = _BATCH if count is None else min(_BATCH, count - j)
        begun = clock()
        try:
            for _ in range(batch):
                call()
        except Exception as exc:
            timing.record_error(exc)
        else:
            latencies.extend(itertools.repeat((clock() - begun) // batch, batch))
        j += batch
    timing.seconds = time.perf_counter() - started
    return timing


def run_hasher(load: Load) -> list[Measurement]:
    """Each hasher on each shape of arguments, against ``json.dumps(sort_keys)`` on the same.

    Hashing is CPU work: it runs once, on one worker, whatever the concurrency asked for. The
    hashers of a shape alternate in rounds, so drift on a shared machine hits them alike.
    """
    measured = []
    for shape, build in SHAPES.items():
        value = build(load.payload_bytes)
        digests = {name: hasher(value) for name, hasher in HASHERS.items()}
        rounds: dict[str, list[Timing]] = {name: [] for name in HASHERS}
        for part in rounds_of(load):
            for name, hasher in HASHERS.items():
                rounds[name].append(_time_sync(functools.partial(hasher, value), part))
        timings = {name: merge(parts) for name, parts in rounds.items()}
        notes = {
            "shape": shape,
            "value_bytes": len(json.dumps(value).encode()),
            "fingerprint_pass": "compiled" if COMPILED else "pure Python",
        }
        measured += [
            Measurement(
                backend=f"{name} {shape}",
                scenario="hasher",
                concurrency=1,
                subject=timing,
                floor=timings[HASHER_FLOOR],
                floor_name=f"{HASHER_FLOOR} + sha256",
                notes={
                    **notes,
                    "agrees_with_rfc8785": digests[name] == digests["rfc8785"],
                    **_against_rfc8785(timing, timings["rfc8785"]),
                },
            )
            for name, timing in timings.items()
        ]
    return measured


def _against_rfc8785(timing: Timing, reference: Timing) -> dict[str, float]:
    """How many times faster than ``rfc8785`` + SHA-256: at p50, and in operations a second."""
    p50, reference_p50 = timing.latency_ms()["p50"], reference.latency_ms()["p50"]
    ops, reference_ops = timing.ops_per_s, reference.ops_per_s
    if not p50 or not reference_p50 or not ops or not reference_ops:
        return {}
    return {"rfc8785_x_p50": reference_p50 / p50, "rfc8785_x_ops": ops / reference_ops}
