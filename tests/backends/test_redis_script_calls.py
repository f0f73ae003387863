"""How the Redis store packs a script call: hiredis where installed, its own packer otherwise,
the same bytes either way."""

from __future__ import annotations

import secrets

import hiredis
import pytest

from idemstore import Outcome, open_store
from idemstore.backends.redis import script_calls
from idemstore.backends.redis.script_calls import packed_call
from idemstore.backends.redis.scripts import SCRIPTS

ARGS: list[tuple[str | bytes, ...]] = [
    ("fingerprint", "token", "30000000", "3600000000", "3600060002"),
    ("é ü 漢字", b"\x00\r\n raw", ""),
    (),
]


@pytest.mark.parametrize("args", ARGS)
def test_hiredis_and_the_fallback_pack_the_same_evalsha(args: tuple[str | bytes, ...]) -> None:
    script = SCRIPTS["reserve"]
    key = b"idemstore:scope:k\xc3\xa9y"
    head = b"$7\r\nEVALSHA\r\n$40\r\n" + script.sha.encode() + b"\r\n$1\r\n1\r\n"
    ours = packed_call(head, 3, key, args)
    assert ours == hiredis.pack_command((b"EVALSHA", script.sha.encode(), b"1", key, *args))


async def test_a_store_without_hiredis_packs_its_calls_itself(
    redis_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(script_calls, "_pack", None)
    key = f"no-hiredis-{secrets.token_hex(4)}"
    async with open_store(redis_store_url) as store:
        first = await store.reserve(key, "fp", lease_ttl=30, retention=60)
        assert first.outcome is Outcome.ACQUIRED and first.lease is not None
        assert await store.complete(first.lease, b"done \xc3\xa9")
        again = await store.reserve(key, "fp", lease_ttl=30, retention=60)
        assert again.outcome is Outcome.COMPLETED
        assert again.record is not None and again.record.response == b"done \xc3\xa9"
