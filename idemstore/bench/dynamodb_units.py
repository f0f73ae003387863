"""DynamoDB's billing rules, applied to the items the store writes: item size, capacity units.

The rules (AWS DynamoDB Developer Guide, "Item sizes and formats" and "Read/write capacity
mode"), as applied here:

- an item's size is the sum over its attributes of the attribute name's UTF-8 length plus
  the value's size: a string its UTF-8 length, a binary its length, a number 1 byte plus 1
  per two significant digits, a boolean or null 1 byte, a list or map 3 bytes plus its
  elements (and, for a map, their names) plus 1 byte per element;
- a write takes one write unit per started 1 KB of the item (for an update, of the larger of
  the item before and after it); a conditional write whose condition fails still takes the
  units of the item it was checked against (at least one);
- a strongly consistent read takes one read unit per started 4 KB, an eventually consistent
  one half that;
- storage is billed on the item's size plus 100 bytes of indexing overhead per item.
"""

from __future__ import annotations

import base64
import math
from typing import Any

__all__ = [
    "STORAGE_OVERHEAD_BYTES",
    "attribute_value_bytes",
    "item_bytes",
    "read_units",
    "write_units",
]

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
STORAGE_OVERHEAD_BYTES = 100


def _number_bytes(text: str) -> int:
    digits = text.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    return 1 + math.ceil(max(len(digits), 1) / 2)


def attribute_value_bytes(value: dict[str, Any]) -> int:
    """The size of one attribute value in DynamoDB's wire form (``{"S": "..."}`` and so on)."""
    ((kind, content),) = value.items()
    if kind == "S":
        return len(str(content).encode())
    if kind == "N":
        return _number_bytes(str(content))
    if kind == "B":
        raw = content if isinstance(content, bytes | bytearray) else base64.b64decode(content)
        return len(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(attribute_value_bytes(item) + 1 for item in content)
    if kind == "M":
        return 3 + sum(
            len(name.encode()) + attribute_value_bytes(item) + 1 for name, item in content.items()
        )
    if kind == "SS":
        return sum(len(str(item).encode()) for item in content)
    if kind == "NS":
        return sum(_number_bytes(str(item)) for item in content)
    if kind == "BS":
        return sum(len(item) for item in content)
    raise ValueError(f"not a DynamoDB attribute value: {value!r}")


def item_bytes(item: dict[str, dict[str, Any]]) -> int:
    """An item's size as DynamoDB counts it for capacity units and its 400 KB limit."""
    return sum(len(name.encode()) + attribute_value_bytes(value) for name, value in item.items())


def write_units(before: int, after: int = 0) -> int:
    """Write units of one write: the larger item of before and after, per started 1 KB (a
    failed conditional write: pass the checked item as ``before``). At least one."""
    return max(1, math.ceil(max(before, after) / WRITE_UNIT_BYTES))


def read_units(size: int, *, consistent: bool = True) -> float:
    """Read units of one read of an item of ``size`` bytes."""
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2
