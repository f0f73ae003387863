"""The DynamoDB store's options, declared once (see ``idemstore.backends.store_options``).

Imports no driver: ``idemstore options dynamodb`` and the docs read this table without
aiobotocore installed. The region checks live here too, so a wrong region is refused by its
syntax before any request (botocore would build a host name from it and report the failed
DNS lookup as an unreachable endpoint).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from idemstore.backends.store_options import Option, Options, at_least, check_clock
from idemstore.backends.urls import redact_url
from idemstore.errors import ConfigurationError
from idemstore.records import MAX_KEY_LENGTH, check_duration

__all__ = ["CHAIN", "OPTIONS", "check_region"]

# Where botocore finds a region the URL does not give, as error messages name it.
CHAIN = " (from the AWS chain: AWS_DEFAULT_REGION, AWS_REGION or the profile)"

# What botocore accepts as a region at all: one DNS label (it becomes part of a host name).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# The shape of every AWS region name (us-east-1, us-gov-west-1, eusc-de-east-1): without an
# endpoint_url, anything else can only end in a failed DNS lookup.
_AWS_REGION = re.compile(r"^[a-z]{2,4}(?:-[a-z]+)+-[0-9]{1,2}$")


def _check_label(region: str, found_in: str) -> None:
    if not _HOST_LABEL.match(region):
        raise ConfigurationError(
            f"region {region!r}{found_in} is not a valid AWS region name: letters, digits and "
            "hyphens, like eu-west-1"
        )


def _region(name: str, value: Any) -> Any:
    _check_label(value, "")
    return value


def check_region(region: str | None, endpoint_url: str | None, *, found_in: str = "") -> None:
    """Refuse a region botocore cannot use (``found_in`` says where it came from, for the
    message). A local endpoint (DynamoDB Local, moto) takes any one-label name (``local``);
    AWS only names like ``eu-west-1``."""
    if region is None:
        return
    _check_label(region, found_in)
    if endpoint_url is None and not _AWS_REGION.match(region):
        raise ConfigurationError(
            f"region {region!r}{found_in} is not an AWS region: use a name like eu-west-1 or "
            "us-east-1 (or give endpoint_url for a local endpoint)"
        )


def _endpoint_url(name: str, value: Any) -> Any:
    if "@" in value.split("?", 1)[0]:
        # botocore logs and reports the endpoint as given, password and all; DynamoDB signs
        # requests with AWS credentials and never reads these.
        raise ConfigurationError(
            f"{name} must not carry a user or password (DynamoDB takes credentials from the "
            f"AWS chain): {redact_url(value)!r}"
        )
    return value


def _margin(name: str, value: Any) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{name} must be >= 0 seconds, not {value!r}")
    return float(value)


OPTIONS = Options(
    Option(
        "region",
        str,
        None,
        "the table's region, like `eu-west-1` (with `endpoint_url`, any name: `local`)",
        _region,
        shown_default="AWS chain (`AWS_DEFAULT_REGION`, profile)",
    ),
    Option(
        "endpoint_url",
        str,
        None,
        "DynamoDB Local, moto, or another compatible endpoint (`http://127.0.0.1:8000`); "
        "never with a user or password in it (refused: botocore would log it)",
        _endpoint_url,
        shown_default="AWS",
    ),
    Option(
        "profile",
        str,
        None,
        "a named profile from `~/.aws/config`",
        shown_default="chain default",
    ),
    Option(
        "auto_create",
        bool,
        False,
        "create the table (as `idemstore migrate` does) on first use",
    ),
    Option(
        "clock_skew",
        float,
        0.1,
        "seconds by which this host's clock may differ from the other clients' clocks: "
        "deadlines count as passed that much later",
        _margin,
    ),
    Option(
        "compress_min_bytes",
        int,
        1024,
        "responses this large or larger are zlib-compressed, if that makes them smaller",
        at_least(0),
    ),
    Option(
        "max_attempts",
        int,
        3,
        'total attempts per request, the first included (botocore "standard" retries)',
        at_least(1),
    ),
    Option(
        "connect_timeout", float, 2.0, "seconds to open a connection, per attempt", check_duration
    ),
    Option(
        "read_timeout", float, 5.0, "seconds to wait for an answer, per attempt", check_duration
    ),
    Option(
        "call_timeout",
        float,
        8.0,
        "hard cap in seconds on one request, its attempts and backoff included: an endpoint"
        " that accepts connections and never answers fails within it",
        check_duration,
    ),
    Option("max_pool_connections", int, 50, "HTTP connections the client keeps open", at_least(1)),
    Option("max_key_length", int, MAX_KEY_LENGTH, "the longest key the store accepts", at_least(1)),
    Option("session", object, None, "your own aiobotocore session", url=False),
    Option("clock", object, time.time, "the time source, epoch seconds", check_clock, url=False),
)
