"""``idemstore.instrument()``: nothing happens without it, and what it records about keys."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import idemstore
from idemstore import Idempotency, open_store
from idemstore.backends.memory import MemoryStore
from idemstore.errors import ConfigurationError
from tests.conftest import ROOT, make_venv, output_of

if TYPE_CHECKING:
    from tests.telemetry.conftest import Telemetry

SECRET_KEY = "order-4711-secret"
SECRET_BODY = b"card=4111111111111111"


def _run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_without_instrument_nothing_is_wrapped_and_opentelemetry_is_not_imported() -> None:
    out = _run_python(
        """
        import asyncio, sys
        import idemstore
        from idemstore import Idempotency, Sweeper, open_store
        async def main():
            async with open_store("memory://") as store:
                await Idempotency(store).run("k", "f", lambda: asyncio.sleep(0, b"x"))
                await Sweeper(store).sweep_once()
                print(type(store).__name__, "opentelemetry" in sys.modules)
        asyncio.run(main())
        """
    )
    assert out == "MemoryStore False"


WITHOUT_OTEL = """
import asyncio
import idemstore

async def main():
    async with idemstore.open_store("memory://") as store:
        result = await idemstore.Idempotency(store).run("k", "f", lambda: asyncio.sleep(0, b"x"))
        assert result.value == b"x"
    try:
        idemstore.instrument()
    except idemstore.MissingDependencyError as exc:
        print(exc)

asyncio.run(main())
"""


@pytest.mark.slow
def test_without_the_otel_extra_everything_works_and_instrument_names_it(
    built_wheel: Path, tmp_path: Path
) -> None:
    bin_dir = make_venv(tmp_path / "venv", str(built_wheel))
    printed = output_of(bin_dir / "python", "-c", WITHOUT_OTEL, cwd=tmp_path, timeout=120)
    assert "pip install '.[otel]' (in idemstore's checkout)" in printed


def test_record_keys_must_be_false_true_or_hash() -> None:
    with pytest.raises(ConfigurationError):
        idemstore.instrument(record_keys="raw")  # type: ignore[arg-type]


def test_a_store_built_directly_is_instrumented_by_the_consumer_using_it(
    telemetry: Telemetry,
) -> None:
    store = MemoryStore()
    assert idemstore.telemetry.instrumented(store) is not store
    wrapped = idemstore.telemetry.instrumented(store)
    assert idemstore.telemetry.instrumented(wrapped) is wrapped


def _all_attribute_values(telemetry: Telemetry) -> list[str]:
    values: list[str] = []
    for span in telemetry.spans():
        values += [str(v) for v in (span.attributes or {}).values()]
        values.append(span.name)
        values.append(str(span.status.description))
    for name in idemstore.telemetry.METRICS:
        for point in telemetry.points(name):
            values += [str(v) for v in point.attributes.values()]
    return values


async def _keyed_run() -> None:
    async with open_store("memory://") as store:
        runner = Idempotency(store)

        async def work() -> bytes:
            return SECRET_BODY

        await runner.run(SECRET_KEY, "f" * 64, work, scope="tenant-secret")
        await runner.run(SECRET_KEY, "f" * 64, work, scope="tenant-secret")
        with pytest.raises(idemstore.ConflictError):
            await runner.run(SECRET_KEY, "e" * 64, work, scope="tenant-secret")


async def test_no_key_scope_or_body_appears_in_spans_or_metrics_by_default(
    telemetry: Telemetry,
) -> None:
    await _keyed_run()
    values = _all_attribute_values(telemetry)
    assert telemetry.spans()
    for secret in (SECRET_KEY, "tenant-secret", SECRET_BODY.decode(), "4111"):
        assert not [v for v in values if secret in v], secret


async def test_record_keys_hash_puts_a_hash_and_never_the_key(telemetry: Telemetry) -> None:
    idemstore.instrument(
        meter_provider=telemetry.meter_provider,
        tracer_provider=telemetry.tracer_provider,
        record_keys="hash",
    )
    await _keyed_run()
    expected = hashlib.sha256(f"tenant-secret\x00{SECRET_KEY}".encode()).hexdigest()[:32]
    hashes = {s.attributes.get("idemstore.key.hash") for s in telemetry.spans("idemstore reserve")}
    assert hashes == {expected}
    assert not [v for v in _all_attribute_values(telemetry) if SECRET_KEY in v]


async def test_record_keys_true_puts_the_raw_key_and_scope(telemetry: Telemetry) -> None:
    idemstore.instrument(
        meter_provider=telemetry.meter_provider,
        tracer_provider=telemetry.tracer_provider,
        record_keys=True,
    )
    await _keyed_run()
    reserves = telemetry.spans("idemstore reserve")
    assert {s.attributes.get("idemstore.key") for s in reserves} == {SECRET_KEY}
    assert {s.attributes.get("idemstore.scope") for s in reserves} == {"tenant-secret"}
    # Never on metrics: a key per time series would be unbounded cardinality.
    for name in idemstore.telemetry.METRICS:
        for point in telemetry.points(name):
            assert "idemstore.key" not in point.attributes


def test_spans_start_once_the_application_installs_a_tracer_provider() -> None:
    out = _run_python(
        """
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import idemstore

        idemstore.instrument()  # no provider yet: the API's default, which records nothing

        async def calls(store, prefix):
            runner = idemstore.Idempotency(store)
            async def work():
                return b"x"
            for i in range(40):
                await runner.run(f"{prefix}{i}", "f", work)

        async def main():
            exporter = InMemorySpanExporter()
            async with idemstore.open_store("memory://") as store:
                await calls(store, "before")
                provider = TracerProvider()
                provider.add_span_processor(SimpleSpanProcessor(exporter))
                trace.set_tracer_provider(provider)
                await calls(store, "after")
            runs = [s for s in exporter.get_finished_spans() if s.name == "idemstore runner"]
            names = sorted({s.name for s in exporter.get_finished_spans()})
            print(len(runs), names)

        asyncio.run(main())
        """
    )
    # None of the 40 calls before; after, spans start within RECHECK_EVERY (64) operations
    # (3 per call here: the consumer, reserve, complete), so from the 22nd call on at most.
    count, names = out.split(" ", 1)
    assert 40 - 64 // 3 <= int(count) < 40
    assert names == "['idemstore complete', 'idemstore reserve', 'idemstore runner']"


AUTO_RUN = """
import asyncio, idemstore

async def main():
    async with idemstore.open_store("memory://") as store:
        runner = idemstore.Idempotency(store)
        async def work():
            return b"x"
        await runner.run("k", "f", work)
        await runner.run("k", "f", work)

asyncio.run(main())
"""


def test_opentelemetry_instrument_needs_no_line_of_code(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(AUTO_RUN)
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    done = subprocess.run(
        [str(launcher), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={
            **os.environ,
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        },
    )
    names = re.findall(r'"name": "(idemstore [a-z]+)"', done.stdout)
    # The first call executed (consumer, reserve, complete), the retry replayed (consumer,
    # reserve).
    assert sorted(names) == sorted(
        ["idemstore runner"] * 2 + ["idemstore reserve"] * 2 + ["idemstore complete"]
    )
    assert '"idemstore.call.outcome": "replayed"' in done.stdout


def test_the_observability_page_lists_every_metric_with_its_kind_unit_and_attributes() -> None:
    page = (ROOT / "docs" / "observability.md").read_text()
    for name, (kind, unit, attributes) in idemstore.telemetry.METRICS.items():
        rows = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, name
        cells = [cell.strip() for cell in rows[0].split("|")]
        assert cells[2].startswith(kind) and unit in cells[2], (name, cells[2])
        for attribute in attributes.split(", "):
            assert f"`{attribute}`" in cells[3], (name, attribute)
