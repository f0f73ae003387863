"""Every backend refuses a URL it cannot honour with ``ConfigurationError`` when the store is
opened, before any connection: bad paths, hosts and databases, unknown options, and option
values out of range."""

from __future__ import annotations

import pytest

from idemstore import ConfigurationError, open_store
from idemstore.backends.registry import engine_for_url
from idemstore.testing.fixtures import require_driver

BAD_URLS = [
    # sqlite
    "sqlite://",
    "sqlite:///",
    "sqlite://host/idem.db",
    "sqlite:///idem.db?synchronous=off",
    "sqlite:///idem.db?busy_timeout=0",
    "sqlite:///idem.db?auto_migrate=perhaps",
    "sqlite:///idem.db?journal_mode=delete",
    # postgres
    "postgresql://localhost/db?colour=blue",
    "postgresql://localhost/db?schema=bad-name",
    'postgresql://localhost/db?schema=x"; DROP TABLE y; --',
    "postgresql://localhost/db?schema=" + "s" * 64,
    "postgresql://localhost/db?schema=1abc",
    "postgresql://localhost/db?pool_min_size=5&pool_max_size=2",
    "postgresql://localhost/db?pool_max_size=zero",
    "postgresql://localhost/db?command_timeout=-1",
    "postgresql://localhost/db?auto_migrate=maybe",
    "postgresql://localhost/db?statement_cache_size=-1",
    "postgresql://localhost/db?sweep_batch_size=0",
    # redis
    "redis://localhost/?colour=blue",
    "redis://localhost/?prefix={tag}",
    "redis://a:1,b:2/",
    "redis://localhost:99999/",
    "redis://localhost/notadb",
    "redis+cluster://a:1,b:2/3",
    "redis://localhost/?ssl_ca_certs=/x.pem",
    "redis://localhost/?expiry_grace=-1",
    "redis://localhost/?expiry_grace=1e20",
    "redis://localhost/?socket_timeout=0",
    "rediss://localhost/?ssl_cert_reqs=sometimes",
    "redis://localhost/?retries=-1",
    # dynamodb
    "dynamodb://",
    "dynamodb://ab",
    "dynamodb://bad$name",
    "dynamodb://idem/extra",
    "dynamodb://idem?nonsense=1",
    "dynamodb://idem?clock_skew=-1",
    "dynamodb://idem?auto_create=perhaps",
    "dynamodb://idem?max_attempts=0",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    # Without its driver a backend says so first (MissingDependencyError), which is not what
    # this test is about.
    engine = engine_for_url(url)
    assert engine is not None and engine.driver is not None and engine.extra is not None
    require_driver(engine.name, engine.driver, engine.extra)
    with pytest.raises(ConfigurationError):
        open_store(url)
