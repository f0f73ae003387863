"""DynamoDB errors a user can act on: a hanging endpoint gives up after the attempts it was
allowed, and a wrong region is a configuration error naming it, found before any request."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TYPE_CHECKING

import pytest

from idemstore import ConfigurationError, StoreUnavailableError, open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def hanging_endpoint() -> AsyncIterator[tuple[str, list[bytes]]]:
    """``http://127.0.0.1:PORT`` that accepts every connection, reads each request's
    headers (kept in the list) and never answers."""
    requests: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def starve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            requests.append(await reader.readuntil(b"\r\n\r\n"))
            await reader.read()  # until the client gives up and closes

    server = await asyncio.start_server(starve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_a_hanging_endpoint_is_unavailable_after_exactly_max_attempts_requests(
    dynamodb_endpoint: str, max_attempts: int
) -> None:
    # dynamodb_endpoint: for its dummy credentials (no request may reach a real account).
    async with hanging_endpoint() as (endpoint, requests):
        url = (
            f"dynamodb://idem_hanging?region=us-east-1&endpoint_url={endpoint}"
            f"&max_attempts={max_attempts}&connect_timeout=0.2&read_timeout=0.2"
        )
        with pytest.raises(StoreUnavailableError, match="did not answer in time"):
            async with open_store(url):
                pass
    # Each attempt is bounded by the timeouts: so is the whole, once attempts are counted
    # right (botocore's own "max_attempts" made one more).
    assert len(requests) == max_attempts
    assert all(b"DynamoDB_20120810.GetItem" in request for request in requests)


@pytest.mark.parametrize("region", ["not-a-region", "eu-west", "eu_west_1", "eu west 1", "-eu-1"])
def test_a_region_that_is_no_aws_region_is_a_configuration_error_naming_it(region: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"region {region!r}")):
        open_store("dynamodb://idem_orders", region=region)


def test_a_region_in_the_url_is_checked_when_the_store_is_opened() -> None:
    with pytest.raises(ConfigurationError, match="region 'not-a-region' is not an AWS region"):
        open_store("dynamodb://idem_orders?region=not-a-region")


def test_a_local_endpoint_takes_any_one_word_region_but_not_a_malformed_one() -> None:
    local = "dynamodb://idem_orders?endpoint_url=http://127.0.0.1:8000"
    open_store(local + "&region=local")
    with pytest.raises(ConfigurationError, match="region 'my region'"):
        open_store(local + "&region=my%20region")


@pytest.mark.parametrize(
    ("region", "says"),
    [("not-a-region", "is not an AWS region"), ("eu_west_1", "is not a valid AWS region name")],
)
async def test_a_wrong_region_from_the_environment_fails_before_any_request(
    region: str, says: str, dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.delenv("AWS_REGION", raising=False)
    store = open_store("dynamodb://idem_orders?connect_timeout=0.2&max_attempts=1")
    try:
        with pytest.raises(ConfigurationError) as caught:
            await store.get("k")
    finally:
        await store.close()
    assert f"region {region!r} (from the AWS chain" in str(caught.value)
    assert says in str(caught.value)
