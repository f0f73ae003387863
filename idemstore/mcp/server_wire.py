"""What the SEP-3182 server adapters (``idemstore.mcp.server``) hand each framework: a tool
call's outcome taken from the SDK's or FastMCP's shapes (``error_outcome``, ``raise_outcome``,
``tool_result_wire``) and given back to them, fresh or replayed (``deliver_lowlevel``,
``deliver_fastmcp``), and the JSON-RPC errors on the wire (``wire_error``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from idemstore.errors import MissingDependencyError
from idemstore.mcp import outcomes
from idemstore.mcp.outcome_policy import case_of, decide
from idemstore.mcp.outcomes import ToolOutcome, render_result

try:
    import mcp_types
    from fastmcp.exceptions import NotFoundError
    from fastmcp.tools.base import RawStructuredToolResult, ToolResult
    from mcp.shared.exceptions import MCPError
    from pydantic import BaseModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError.needing(
        "idemstore.mcp.server", "the MCP SDK and FastMCP", exc, "mcp"
    ) from exc

if TYPE_CHECKING:
    from mcp.server.context import HandlerResult

__all__ = [
    "ReplayedToolError",
    "deliver_fastmcp",
    "deliver_lowlevel",
    "dump",
    "error_outcome",
    "raise_outcome",
    "rpc_error",
    "tool_result_wire",
    "wire_error",
]


class ReplayedToolError(Exception):
    """Raised on replay of a call whose tool raised an unexpected exception the first time.

    Its message is the original exception's, so the SDK puts the same error on the wire.
    """


def rpc_error(code: int, message: str, data: dict[str, Any] | None = None) -> MCPError:
    return MCPError(code=code, message=message, data=data)


def wire_error(body: dict[str, Any]) -> MCPError:
    return rpc_error(body["code"], body["message"], body.get("data"))


def error_outcome(exc: MCPError) -> ToolOutcome:
    error = exc.error
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    record = decide({"error": body}, "sep") == "record"  # never a refusal, nor -32800
    return ToolOutcome("error", body, record=record, original=exc)


def raise_outcome(kind: str, exc: BaseException) -> ToolOutcome:
    return ToolOutcome("raise", {"class": kind, "message": str(exc)}, original=exc)


def dump(result: object) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    if isinstance(result, Mapping):
        return dict(result)
    return {}


def deliver_lowlevel(outcome: ToolOutcome, version: str, stamp: object) -> HandlerResult:
    original = outcome.original
    if not outcome.replayed:
        if isinstance(original, BaseException):
            raise original
        return original if isinstance(original, BaseModel | dict) else dict(outcome.body)
    body = outcome.body
    if outcome.kind == "result":
        return render_result(outcomes.replay_marked(body), version, stamp)
    if outcome.kind == "error":
        raise wire_error(body)
    raise ReplayedToolError(body.get("message", ""))


def tool_result_wire(result: ToolResult) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "content": [block.model_dump(by_alias=True, mode="json") for block in result.content],
        "isError": result.is_error,
    }
    if result.structured_content is not None:
        wire["structuredContent"] = result.structured_content
    if result.meta is not None:
        wire["_meta"] = result.meta
    return wire


def deliver_fastmcp(outcome: ToolOutcome) -> ToolResult:
    original = outcome.original
    if not outcome.replayed:
        if isinstance(original, BaseException):
            raise original
        return original  # type: ignore[return-value]
    body = outcome.body
    if outcome.kind == "result" and case_of({"result": body}) == "task":
        # A task handle goes to the SDK's runner as recorded, as the tasks extension's own
        # result model did: FastMCP hands any result that is not a ToolResult through.
        return outcomes.replay_marked(body)  # type: ignore[return-value]
    if outcome.kind == "result":
        body = outcomes.replay_marked(body)
        wire = mcp_types.CallToolResult.model_validate(body)
        structured = body.get("structuredContent")
        if structured is None or isinstance(structured, dict):
            return ToolResult.from_mcp_result(wire)
        return RawStructuredToolResult(
            content=wire.content,
            structured_content=structured,
            meta=wire.meta,
            is_error=wire.is_error,
        )
    if outcome.kind == "error":
        raise wire_error(body)
    message = body.get("message", "")
    if body.get("class") == "not_found":
        raise NotFoundError(message)
    if body.get("class") == "tool_error":
        # The isError result FastMCP made of the (already masked) ToolError, marked.
        return ToolResult(content=message, is_error=True, meta=outcomes.replay_marked({})["_meta"])
    raise ReplayedToolError(message)
