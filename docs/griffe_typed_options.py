"""A griffe extension: ``**options: Unpack[SomeOptions]`` rendered as the keywords it stands for.

idemstore declares a door's options once, as a ``TypedDict`` (``PolicyOptions``, ...), and the
door takes them as ``**policy: Unpack[PolicyOptions]``; the class it forwards them to holds
their defaults (``ExecutionPolicy.__init__``). Read as written, the reference would show
``**policy`` and list ``lease_ttl`` in the table as a required argument with no type. This
extension replaces such a parameter by one keyword-only parameter per key of the ``TypedDict``
(its bases' keys first), each with the key's annotation and the default its holder declares,
so the signature reads ``lease_ttl: float = 30.0`` and the table has the type and default.

mkdocs.yml names, per ``TypedDict`` (by class name, so a module move changes nothing), the
functions that hold the defaults (first match wins), by their public import path where
there is one::

    - docs/griffe_typed_options.py:TypedOptions:
        defaults:
          PolicyOptions: [idemstore.ExecutionPolicy.__init__]

A key with no holder keeps no default (it is then shown without one, never as required: a
``TypedDict`` declared ``total=False`` makes every key optional). A ``TypedDict`` that is not
in the table is an error, so a new door's options cannot render as ``**options`` unnoticed.
"""

from __future__ import annotations

from typing import Any

import griffe

__all__ = ["TypedOptions"]


class TypedOptions(griffe.Extension):
    """Expands ``**name: Unpack[TypedDict]`` parameters (see the module docstring)."""

    def __init__(self, defaults: dict[str, list[str]] | None = None) -> None:
        super().__init__()
        self.defaults = defaults or {}

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for function in _functions(pkg):
            self._expand(function, loader)

    def _expand(self, function: griffe.Function, loader: griffe.GriffeLoader) -> None:
        expanded: list[griffe.Parameter] = []
        changed = False
        for parameter in function.parameters:
            options = _unpacked(parameter)
            if options is None:
                expanded.append(parameter)
                continue
            options = options.rpartition(".")[2]
            if options not in self.defaults:
                raise griffe.GriffeError(
                    f"{function.path}: **{parameter.name}: Unpack[{options}]: add {options} and"
                    " the functions holding its defaults to the extension's `defaults` in"
                    " mkdocs.yml"
                )
            declared = _resolve(loader, _unpacked(parameter) or "")
            holders = [_resolve(loader, path) for path in self.defaults[options]]
            taken = {p.name for p in function.parameters}
            for name, annotation in _keys(declared):
                if name in taken:
                    continue
                expanded.append(
                    griffe.Parameter(
                        name,
                        annotation=annotation,
                        kind=griffe.ParameterKind.keyword_only,
                        default=_default(holders, name),
                    )
                )
            changed = True
        if changed:
            function.parameters = griffe.Parameters(*expanded)


def _functions(obj: griffe.Object) -> list[griffe.Function]:
    found: list[griffe.Function] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Function):
            found.append(member)
        elif isinstance(member, griffe.Module | griffe.Class):
            found.extend(_functions(member))
    return found


def _unpacked(parameter: griffe.Parameter) -> str | None:
    """The canonical path of ``SomeOptions`` for ``**x: Unpack[SomeOptions]``, else None."""
    annotation = parameter.annotation
    if parameter.kind is not griffe.ParameterKind.var_keyword:
        return None
    if not isinstance(annotation, griffe.ExprSubscript):
        return None
    if annotation.canonical_path not in ("typing.Unpack", "typing_extensions.Unpack"):
        return None
    inner = annotation.slice
    return inner.canonical_path if isinstance(inner, griffe.Expr) else str(inner)


def _resolve(loader: griffe.GriffeLoader, path: str) -> griffe.Object:
    found = loader.modules_collection.get_member(path)
    return found.final_target if found.is_alias else found


def _keys(declared: griffe.Object) -> list[tuple[str, str | griffe.Expr | None]]:
    """The keys of a ``TypedDict`` class with their annotations, its bases' first."""
    assert isinstance(declared, griffe.Class), declared
    keys: dict[str, str | griffe.Expr | None] = {}
    for cls in [*reversed(declared.mro()), declared]:
        for name, member in cls.members.items():
            if not member.is_alias and isinstance(member, griffe.Attribute) and member.annotation:
                keys[name] = member.annotation
    return list(keys.items())


def _default(holders: list[griffe.Object], name: str) -> str | griffe.Expr | None:
    for holder in holders:
        assert isinstance(holder, griffe.Function), holder
        for parameter in holder.parameters:
            if parameter.name == name and parameter.default is not None:
                return parameter.default
    return None
