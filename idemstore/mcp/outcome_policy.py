"""Which answers to a keyed ``tools/call`` are recorded, and which release the key: one table.

The proxy and the gateway (through ``idemstore.mcp.tool_calls``) and the server adapters
(``idemstore.mcp.server``) all ask ``decide(message, kind)``; docs/mcp-proxy.md#what-is-recorded
prints ``POLICY`` as a table (a test holds the two together). ``message`` is the final
JSON-RPC response (``{"result": ...}`` or ``{"error": ...}``), ``None`` when none came.

Nothing is recorded that a retry would be wrong to get: a refusal (no tool ran), a cancelled
call (``-32800``: the tool never finished), an MRTR ``input_required`` ask (the exchange goes
on), no answer at all. A task handle (SEP-2663's ``resultType: "task"``) is the server's answer
to a task-augmented call: recorded like a result, so a retry gets the same task instead of
starting a second one (``tasks/*`` requests carry no key and pass through). Derived
and ``_meta`` keys follow mcp-idempotent and record results only; SEP-3182 keys record errors
too (the SEP replays whatever happened).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from idemstore.mcp import sep3182

__all__ = [
    "CASES",
    "POLICY",
    "TASK_RESULT_TYPE",
    "Case",
    "Decision",
    "KeyKind",
    "case_of",
    "decide",
]

TASK_RESULT_TYPE = "task"
"""SEP-2663's ``resultType`` of a task-augmented ``tools/call`` answer: the task's handle."""

KeyKind = Literal["sep", "meta", "derived"]
Decision = Literal["record", "release"]
Case = Literal[
    "result",
    "task",
    "tool_error",
    "error",
    "refusal",
    "cancelled",
    "input_required",
    "no_answer",
]

CASES: tuple[Case, ...] = (
    "result",
    "task",
    "tool_error",
    "error",
    "refusal",
    "cancelled",
    "input_required",
    "no_answer",
)

_ALWAYS: Mapping[KeyKind, Decision] = {"sep": "record", "meta": "record", "derived": "record"}
_NEVER: Mapping[KeyKind, Decision] = {"sep": "release", "meta": "release", "derived": "release"}

POLICY: Mapping[Case, Mapping[KeyKind, Decision]] = {
    "result": _ALWAYS,
    "task": _ALWAYS,  # the handle of a task the server started: a retry must get the same one
    "tool_error": _ALWAYS,  # isError: true is the tool's answer, not a failure to answer
    "error": {"sep": "record", "meta": "release", "derived": "release"},
    "refusal": _NEVER,
    "cancelled": _NEVER,
    "input_required": _NEVER,
    "no_answer": _NEVER,
}


def case_of(message: Mapping[str, Any] | None) -> Case:
    """Which row of ``POLICY`` a final response falls in."""
    if message is None:
        return "no_answer"
    if "error" in message:
        error = message["error"]
        code = error.get("code") if isinstance(error, Mapping) else None
        if code in sep3182.REFUSAL_CODES:
            return "refusal"
        if code == sep3182.REQUEST_CANCELLED:
            return "cancelled"
        return "error"
    if "result" not in message:
        return "no_answer"
    result = message["result"]
    if isinstance(result, Mapping):
        if result.get("resultType") == "input_required":
            return "input_required"
        if result.get("resultType") == TASK_RESULT_TYPE:
            return "task"
        if result.get("isError") is True:
            return "tool_error"
    return "result"


def decide(message: Mapping[str, Any] | None, kind: KeyKind) -> Decision:
    """Record the outcome, or release the key so that a retry runs again."""
    return POLICY[case_of(message)][kind]
