"""Django is configured once per test process; each test points the middleware at its store
with ``override_settings`` (the middleware opens one store per configuration)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.django_middleware.project import EFFECTS, configure

if TYPE_CHECKING:
    from collections.abc import Iterator

configure()


@pytest.fixture(params=["memory", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_store_url"))


@pytest.fixture
def idemstore_settings(store_url: str) -> Iterator[str]:
    from django.test import override_settings

    from idemstore.http.django import close_stores

    EFFECTS.clear()
    with override_settings(IDEMSTORE={"STORE": store_url}):
        yield store_url
    close_stores()
