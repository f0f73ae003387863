"""Where ``idemstore gateway`` takes its settings from: flags, the environment, a file.

Every option can be given three ways, and the first that has it wins:

1. the command-line flag (``--lease 20``);
2. an environment variable named after the flag: ``IDEMSTORE_GATEWAY_`` and the flag's name in
   upper case with ``-`` as ``_`` (``IDEMSTORE_GATEWAY_LEASE=20``; a switch such as
   ``--no-verify-replays`` takes ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``;
   a repeatable option such as ``--caller`` takes its values separated by commas);
3. the TOML file named by ``--config FILE`` (or ``IDEMSTORE_GATEWAY_CONFIG``), with the flags'
   names as keys (``lease = 20``, ``caller = ["header:authorization"]``,
   ``no-verify-replays = true``);

and the option's default otherwise. ``defer_defaults`` prepares a parser for this (its options'
defaults become "not given"), ``resolve`` fills in what the flags left out.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ENV_PREFIX", "defer_defaults", "resolve"]

ENV_PREFIX = "IDEMSTORE_GATEWAY_"

_UNSET: Any = object()  # "the flag was not given": argparse leaves a default in place
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def defer_defaults(parser: argparse.ArgumentParser, *, required: tuple[str, ...]) -> None:
    """Let ``resolve`` tell a flag not given from one given its default value.

    ``required`` names the destinations that must come from one of the three sources.
    """
    actions = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        actions[action.dest] = (action, action.default)
        action.required = False
        if isinstance(action, argparse._AppendAction):
            # argparse appends to the default itself: None stays "not given" for these.
            if action.default is not None:
                raise ValueError(f"{action.dest}: a repeatable option must default to None")
            continue
        action.default = _UNSET
    parser.set_defaults(settings=(actions, required))


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Fill in every option the command line left out, from the environment, the file, the
    default (in that order); ``ConfigurationError`` names the source of a bad value."""
    actions, required = args.settings
    file = _file_settings(args, environ)
    known = {action.option_strings[-1].lstrip("-") for action, _ in actions.values()}
    unknown = sorted(set(file) - known)
    if unknown:
        raise ConfigurationError(
            f"unknown setting(s) in the config file: {', '.join(unknown)}; the settings are the"
            f" gateway's flags without their dashes: {', '.join(sorted(known))}"
        )
    for dest, (action, default) in actions.items():
        given = getattr(args, dest)
        if given is not _UNSET and not (given is None and default is None):
            continue
        name = action.option_strings[-1].lstrip("-")
        variable = ENV_PREFIX + name.upper().replace("-", "_")
        if variable in environ:
            value = _converted(action, environ[variable], variable)
        elif name in file:
            value = _converted(action, file[name], f"{name!r} in the config file")
        else:
            value = default
        setattr(args, dest, value)
    for dest in required:
        if getattr(args, dest) is None:
            flag = actions[dest][0].option_strings[-1]
            variable = ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")
            raise ConfigurationError(
                f"{flag} is required: give the flag, {variable}, or {flag.lstrip('-')} in the"
                " config file"
            )


def _file_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    path = args.config if args.config is not _UNSET else environ.get(ENV_PREFIX + "CONFIG")
    if path is None:
        return {}
    try:
        with Path(path).open("rb") as file:
            settings = tomllib.load(file)
    except OSError as exc:
        raise ConfigurationError(f"cannot read the config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"the config file {path} is not TOML: {exc}") from None
    return {key.replace("_", "-"): value for key, value in settings.items()}


def _converted(action: argparse.Action, value: object, source: str) -> Any:
    """``value`` (a string from the environment, or a TOML value) as the flag would give it."""
    try:
        if isinstance(action, argparse._StoreTrueAction):
            return _switch(value)
        if isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*"):
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list):
                raise ValueError("expected a list of values")
            return [_one(action, str(item).strip()) for item in items if str(item).strip()]
        return _one(action, str(value))
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ConfigurationError(f"{source}: {exc}") from None


def _switch(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"expected true or false, not {value!r}")


def _one(action: argparse.Action, text: str) -> Any:
    converted = action.type(text) if callable(action.type) else text
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"{text!r} is not one of {choices}")
    return converted
