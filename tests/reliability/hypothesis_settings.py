"""Hypothesis settings the reliability fuzzers share."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["OVER_ONE_FIXTURE"]

# One fixture (a server, a proxy process) serves every example on purpose, and real I/O makes
# an example slower than Hypothesis expects; no example database: no run depends on the last.
OVER_ONE_FIXTURE = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
