"""Options a door takes as typed keywords (``**options: Unpack[SomeOptions]``, a ``TypedDict``
declared once where the options are defined) and forwards to the class that holds their
defaults and checks: the one check that a keyword is one of them, so a misspelt option fails
with a ``TypeError`` that names it, as a misspelt keyword argument would."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["reject_unknown"]


def reject_unknown(options: Mapping[str, object], declared: type, caller: str) -> None:
    """Raise ``TypeError`` naming every key of ``options`` that the ``TypedDict`` ``declared``
    does not declare; ``caller`` is how the error names the call, e.g. ``"Idempotency()"``."""
    unknown = sorted(set(options) - declared.__optional_keys__ - declared.__required_keys__)  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{caller} got unknown options {unknown}")
