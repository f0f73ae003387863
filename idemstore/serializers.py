"""How ``@Idempotency.idempotent`` records a function's result and gives it back to retries.

A serializer has two methods: ``dumps(value) -> bytes`` (what to record; raise ``TypeError``
or ``ValueError`` for a value it cannot record) and ``loads(data, returns) -> value`` (what a
replay returns; ``returns`` is the decorated function's return annotation, resolved, or
``None`` when it has none or it cannot be resolved). Pass one as
``Idempotency(store, serializer=...)`` or ``idempotent(..., serializer=...)``.

``JSONSerializer`` is the default.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any, Protocol, runtime_checkable

__all__ = ["JSONSerializer", "Serializer", "return_type"]


@runtime_checkable
class Serializer(Protocol):
    """Records a decorated function's result as bytes and rebuilds it for a replay."""

    def dumps(self, value: Any) -> bytes:
        """The bytes to record for ``value``; ``TypeError``/``ValueError`` if it cannot."""
        ...

    def loads(self, data: bytes, returns: Any) -> Any:
        """The value a replay returns for ``data``; ``returns`` is the return annotation."""
        ...


def _pydantic_model(value: object) -> bool:
    # Never imports pydantic: a value can only be a model if pydantic was imported already.
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def _pydantic_model_class(cls: object) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)


def _to_json(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if _pydantic_model(value):
        return value.model_dump(mode="json")  # type: ignore[attr-defined]
    raise TypeError(
        f"a result of type {type(value).__qualname__} cannot be recorded as JSON: return JSON"
        " values, dataclasses or pydantic models, or pass a serializer that handles it"
    )


class JSONSerializer:
    """The default serializer: JSON, with dataclasses and pydantic (v2) models.

    ``dumps`` records JSON values (dicts with str keys, lists, tuples, str, int, float, bool,
    ``None``), dataclass instances (``dataclasses.asdict``) and pydantic models
    (``model_dump(mode="json")``), at any depth; anything else is a ``TypeError`` naming its
    type. ``loads`` returns the JSON value, except when the function's return annotation is a
    dataclass or a pydantic model class: then the same type is rebuilt
    (``Model.model_validate``, or the dataclass with its fields that are annotated as
    dataclasses rebuilt too). So a replay returns what the first call returned, for those
    types; other values come back as their JSON form (a tuple as a list, a dataclass inside
    a list as a dict). pydantic is never imported by idemstore, and not required.
    """

    __slots__ = ()

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, default=_to_json).encode()

    def loads(self, data: bytes, returns: Any) -> Any:
        return _rebuild(json.loads(data), returns)

    def __repr__(self) -> str:
        return "JSONSerializer()"


def _rebuild(value: Any, returns: Any) -> Any:
    if _pydantic_model_class(returns):
        return returns.model_validate(value)
    if isinstance(returns, type) and dataclasses.is_dataclass(returns) and isinstance(value, dict):
        hints = _type_hints(returns) or {}
        # Fields outside __init__ (init=False) are the dataclass's to compute, not ours to pass.
        accepted = {field.name for field in dataclasses.fields(returns) if field.init}
        return returns(
            **{
                name: _rebuild(field, hints.get(name))
                for name, field in value.items()
                if name in accepted
            }
        )
    return value


def _type_hints(target: Any) -> dict[str, Any] | None:
    try:
        return typing.get_type_hints(target)
    except Exception:  # a forward reference that does not resolve: no type to rebuild
        return None


def return_type(func: Any) -> Any:
    """``func``'s resolved return annotation, or ``None`` (none, or it does not resolve)."""
    hints = _type_hints(func)
    return None if hints is None else hints.get("return")
