"""Anonymous clients are never one caller (issue 40, case 4).

Two different clients that present no credential, but send the same bytes where the gateway
used to look for one (a bare ``Bearer``, ``Bearer undefined``, a fixed ``?client=vscode`` in
the server URL they were configured with, a consent cookie), call ``charge`` with identical
arguments and no key (a derived key). Neither may get the other's result: by default each
call is relayed without deduplication (both charges run), with ``--unidentified refuse`` both
are refused, and only ``--unidentified shared`` deduplicates them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from tests.gateway.conftest import ONE_MODE, gateway_url
from tests.gateway.rpc import call, post

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.gateway.processes import Child, Upstream

pytestmark = ONE_MODE

# What each anonymous client sends: headers, and a query string in its configured server URL.
ANONYMOUS: dict[str, tuple[dict[str, str], str]] = {
    "bare-bearer": ({"authorization": "Bearer"}, ""),
    "bearer-undefined": ({"authorization": "Bearer undefined"}, ""),
    "fixed-query": ({}, "?client=vscode"),
    "consent-cookie": ({"cookie": "consent=accepted"}, ""),
}


async def _two_clients_charge(url: str, way: str) -> list[tuple[int, bytes]]:
    """Each of two clients (its own connection pool) charges once, the same way."""
    headers, query = ANONYMOUS[way]
    answers = []
    for n in range(2):
        async with httpx.AsyncClient(timeout=30) as client:
            message = call(n, "charge", {"amount": 5})
            answer = await post(client, url + query, message, headers=headers)
            answers.append((answer.status, answer.body))
    return answers


@pytest.mark.parametrize("way", list(ANONYMOUS))
async def test_anonymous_clients_are_relayed_and_each_charge_runs(
    upstream: Upstream, gateways: Callable[..., Child], way: str
) -> None:
    url = gateway_url(gateways(upstream.url))
    answers = await _two_clients_charge(url, way)
    assert [status for status, _ in answers] == [200, 200]
    assert upstream.executions("charge") == ["charge", "charge"]


@pytest.mark.parametrize("way", list(ANONYMOUS))
async def test_anonymous_clients_are_refused_when_the_operator_says_so(
    upstream: Upstream, gateways: Callable[..., Child], way: str
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--unidentified", "refuse"))
    answers = await _two_clients_charge(url, way)
    assert [status for status, _ in answers] == [400, 400]
    assert all(b"idempotency_caller_unknown" in body for _, body in answers)
    assert upstream.executions("charge") == []


async def test_anonymous_clients_share_a_result_only_when_the_operator_says_so(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--unidentified", "shared"))
    await _two_clients_charge(url, "bare-bearer")
    assert upstream.executions("charge") == ["charge"]
