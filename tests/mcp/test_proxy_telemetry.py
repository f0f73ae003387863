"""The proxy's calls are counted under ``idemstore.consumer = mcp_proxy``: a retried call it
deduplicated is a ``replayed`` point, the first one ``executed``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from idemstore.backends.urls import open_store
from idemstore.mcp.proxy import IdempotentProxy
from tests.mcp.raw import executions, unmarked
from tests.mcp.test_proxy_library import start  # noqa: F401  (the harness fixture)
from tests.telemetry.conftest import telemetry  # noqa: F401  (the in-memory SDK fixture)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.telemetry.conftest import Telemetry


async def test_a_deduplicated_retry_counts_as_replayed_for_the_proxy(
    start: Any,  # noqa: F811
    counter: Path,
    telemetry: Telemetry,  # noqa: F811
) -> None:
    store = open_store("memory://")
    harness = await start(IdempotentProxy(store, run_id="otel-run"))
    harness.call(1, "charge", {"amount": 5})
    first = await harness.next_message()
    harness.call(2, "charge", {"amount": 5})
    retried = await harness.next_message()
    harness.to_proxy.close()
    assert len(executions(counter)) == 1
    assert json.dumps(first["result"]) == json.dumps(unmarked(retried["result"]))
    calls = "idemstore.consumer.calls"
    assert telemetry.total(calls, **{"idemstore.consumer": "mcp_proxy"}) == 2
    replayed = {"idemstore.consumer": "mcp_proxy", "idemstore.call.outcome": "replayed"}
    executed = {"idemstore.consumer": "mcp_proxy", "idemstore.call.outcome": "executed"}
    assert telemetry.total(calls, **replayed) == 1
    assert telemetry.total(calls, **executed) == 1
    # The store was opened through open_store, so its spans carry the registry's label.
    assert {s.attributes["idemstore.backend"] for s in telemetry.spans("idemstore reserve")} == {
        "memory"
    }
