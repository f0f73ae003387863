"""How redis-py's exceptions map onto the idemstore family (the one declaration)."""

from __future__ import annotations

from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from idemstore.backends.driver_errors import DriverErrors, Rule, message_has, unavailable
from idemstore.backends.redis.scripts import RANGE_ERROR
from idemstore.errors import ConfigurationError, IdemstoreError, StoreUnavailableError

__all__ = ["CONNECT_TIMEOUT", "redis_errors"]

# redis-py's words for a TCP connect that ran out of socket_connect_timeout; the store says
# the same of a handshake that did.
CONNECT_TIMEOUT = "Timeout connecting to server"

# What Redis answers a client that gave no password (HELLO, AUTH-less commands) and one that
# gave a wrong one; redis-py raises AuthenticationError for both.
_NO_PASSWORD = ("HELLO must be called with the client already authenticated", "NOAUTH")
_WRONG_PASSWORD = ("WRONGPASS", "invalid username-password pair", "invalid password")

_PASSWORD_IN_URL = (
    "the password goes in the store URL: redis://:PASSWORD@HOST:PORT/0, or redis://USER:PASSWORD@HOST:"
    "PORT/0 for an ACL user (percent-encode characters such as '@', ':' and '/')"
)


def redis_errors(where: str) -> DriverErrors:
    """How redis-py's exceptions map onto the idemstore family, for the store at ``where``."""

    def out_of_range(exc: BaseException) -> IdemstoreError:
        name = str(exc).split()[1]
        return ConfigurationError(
            f"{name} is too long for Redis: the deadline would fall past the year 2255 "
            "(2**53 microseconds after the epoch, the last a Lua number holds exactly)"
        )

    def refused(exc: BaseException) -> IdemstoreError:
        # Redis never echoes the password, and ``where`` is redacted.
        if message_has(*_WRONG_PASSWORD)(exc):
            return ConfigurationError(
                f"redis store {where} refused the user and password of the store URL "
                f"(wrong password, unknown or disabled user); {_PASSWORD_IN_URL}"
            )
        if message_has(*_NO_PASSWORD)(exc):
            return ConfigurationError(
                f"redis store {where} requires a password and the store URL gives none; "
                f"{_PASSWORD_IN_URL}"
            )
        return ConfigurationError(f"redis store {where} refused to authenticate: {exc}")

    def connect_timed_out(exc: BaseException) -> IdemstoreError:
        return StoreUnavailableError(
            f"redis store {where} did not complete a connection within "
            "socket_connect_timeout (is a Redis server listening there, and up?)"
        )

    def own_error(exc: BaseException) -> IdemstoreError:
        assert isinstance(exc.__cause__, IdemstoreError)
        return exc.__cause__

    return DriverErrors(
        catches=(RedisError, RedisClusterException, OSError, TimeoutError),
        rules=(
            # redis-py's cluster discovery wraps what a node's connect raised: the store's
            # own refusal of a volatile primary (persistence) comes out as itself.
            Rule(lambda exc: isinstance(exc.__cause__, IdemstoreError), own_error),
            Rule(
                lambda exc: isinstance(exc, ResponseError) and str(exc).startswith(RANGE_ERROR),
                out_of_range,
            ),
            Rule(lambda exc: isinstance(exc, AuthenticationError), refused),
            Rule(lambda exc: CONNECT_TIMEOUT in str(exc), connect_timed_out),
        ),
        otherwise=unavailable(f"redis store {where}"),
    )
