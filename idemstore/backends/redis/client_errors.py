"""How redis-py's exceptions map onto the idemstore family (the one declaration)."""

from __future__ import annotations

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from idemstore.backends.driver_errors import DriverErrors, Rule, unavailable
from idemstore.backends.redis.scripts import RANGE_ERROR
from idemstore.errors import ConfigurationError, IdemstoreError

__all__ = ["redis_errors"]


def redis_errors(where: str) -> DriverErrors:
    """How redis-py's exceptions map onto the idemstore family, for the store at ``where``."""

    def out_of_range(exc: BaseException) -> IdemstoreError:
        name = str(exc).split()[1]
        return ConfigurationError(
            f"{name} is too long for Redis: the deadline would fall past the year 2255 "
            "(2**53 microseconds after the epoch, the last a Lua number holds exactly)"
        )

    return DriverErrors(
        catches=(RedisError, RedisClusterException, OSError, TimeoutError),
        rules=(
            Rule(
                lambda exc: isinstance(exc, ResponseError) and str(exc).startswith(RANGE_ERROR),
                out_of_range,
            ),
        ),
        otherwise=unavailable(f"redis store {where}"),
    )
