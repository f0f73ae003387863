"""How botocore's exceptions map onto the idemstore error family, declared once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.driver_errors import DriverErrors, Rule
from idemstore.backends.dynamodb.items import error_code, error_message
from idemstore.backends.dynamodb.options import CHAIN
from idemstore.errors import (
    ConfigurationError,
    ResponseTooLargeError,
    SchemaError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["driver_errors"]

_UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "LimitExceededException",
    }
)


def _code(*codes: str, says: str = "") -> Callable[[BaseException], bool]:
    """A predicate: the service answered one of ``codes`` (with ``says`` in its message)."""
    return lambda exc: error_code(exc) in codes and says in error_message(exc).lower()


def _botocore(name: str) -> Callable[[BaseException], bool]:
    """A predicate: ``exc`` is botocore's ``name`` exception (botocore imported lazily, as
    the store imports aiobotocore only when it connects)."""

    def matches(exc: BaseException) -> bool:
        from botocore import exceptions

        return isinstance(exc, getattr(exceptions, name))

    return matches


def driver_errors(where: str, url: str) -> DriverErrors:
    """The mapping for the table described by ``where`` (no credentials), whose store URL
    (for ``idemstore migrate``) is ``url``."""

    def answered(exc: BaseException) -> StoreUnavailableError:
        code, message = error_code(exc), error_message(exc)
        if code in ("AccessDeniedException", "UnrecognizedClientException"):
            return StoreUnavailableError(
                f"{where} refused the request ({code}): check the credentials and the IAM "
                f"permissions listed in docs/backends/dynamodb.md. {message}"
            )
        if code in _UNAVAILABLE_CODES:
            return StoreUnavailableError(
                f"{where} is throttling or failing ({code}) after the SDK's retries: {message}"
            )
        if code is not None:
            return StoreUnavailableError(f"{where} answered {code}: {message}")
        if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
            return StoreUnavailableError(f"{where} did not answer in time: {exc!r}")
        return StoreUnavailableError(f"{where} could not be reached: {exc!r}")

    return DriverErrors(
        # botocore, aiohttp and socket errors share no base class below Exception.
        catches=(Exception,),
        rules=(
            Rule(
                _botocore("NoRegionError"),
                lambda exc: ConfigurationError(
                    "no AWS region for the DynamoDB store: add ?region=... to the URL or set "
                    "AWS_DEFAULT_REGION"
                ),
            ),
            Rule(
                _botocore("InvalidRegionError"),
                lambda exc: ConfigurationError(
                    f"region {getattr(exc, 'kwargs', {}).get('region_name')!r}{CHAIN} is not a "
                    "valid AWS region name: use one like eu-west-1, or add ?region=... to the URL"
                ),
            ),
            Rule(
                _botocore("NoCredentialsError"),
                lambda exc: StoreUnavailableError(
                    f"no AWS credentials found for {where}: configure the usual AWS chain "
                    "(environment, ~/.aws, instance or task role)"
                ),
            ),
            Rule(
                _code("ResourceNotFoundException"),
                lambda exc: SchemaError(
                    f"{where} does not exist: run `idemstore migrate {url}?region=...` "
                    "(or open the store with ?auto_create=true)"
                ),
            ),
            Rule(
                _code("ValidationException", says="key element does not match"),
                lambda exc: SchemaError(
                    f"{where} does not have idemstore's key schema (partition key 'pk', a "
                    f"string): check `idemstore migrate {url} --status`"
                ),
            ),
            Rule(
                _code("ValidationException", says="size"),
                lambda exc: ResponseTooLargeError(
                    f"the item exceeds DynamoDB's 400 KB limit: {error_message(exc)}"
                ),
            ),
        ),
        otherwise=answered,
    )
