"""The refusal a call recording into the caller's transaction (``settle`` or ``checkpoint``
with ``connection=``) meets when the connection cannot carry it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import ConfigurationError, ExecutionPolicy, open_store
from tests.settling.business import open_business
from tests.settling.owners import owned

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import TypeAlias

    from idemstore import Execution

    # The call under test (settle or checkpoint), made by an execution on a connection.
    Attempt: TypeAlias = Callable[[Execution, Any], Awaitable[object]]


async def settle_x(execution: Execution, connection: Any) -> object:
    return await execution.settle(b"x", connection=connection)


async def checkpoint_one(execution: Execution, connection: Any) -> object:
    return await execution.checkpoint("one", connection=connection)


async def refused(execution: Execution, connection: Any, attempt: Attempt) -> str:
    """``attempt`` is refused before anything changed (the execution still owns its key, with
    no checkpoints); then it releases the key and says why it was refused."""
    with pytest.raises(ConfigurationError) as caught:
        await attempt(execution, connection)
    assert not execution.finished
    assert execution.checkpoints == ()
    await execution.release()
    return str(caught.value)


async def refused_elsewhere(store_url: str, other_url: str, attempt: Attempt) -> str:
    """Why ``attempt`` is refused on a transaction open in the database at ``other_url``, by
    the owner of a key in the store at ``store_url``."""
    other = await open_business(other_url)
    try:
        async with open_store(store_url) as store:
            await other.begin()
            execution = await owned(ExecutionPolicy(store), f"refused-{uuid.uuid4().hex[:12]}")
            message = await refused(execution, other.connection, attempt)
            await other.rollback()
    finally:
        await other.close()
    return message
