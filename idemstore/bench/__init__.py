"""``idemstore bench``: compare backends against each other and against their engines' floors.

Importing this package imports no driver, rich or matplotlib; each is imported when used.

```python
from idemstore.bench import BenchConfig, bench

result = await bench(["redis://127.0.0.1:6379/0"], BenchConfig(scenarios=("fresh",), ops=500))
for m in result.measurements:
    print(m.backend, m.scenario, m.concurrency, m.subject.latency_ms()["p50"], m.ratio_p50)
```
"""

from __future__ import annotations

from idemstore.bench.results import BenchResult, Measurement, Timing, Unavailable
from idemstore.bench.runner import BenchConfig, Target, bench, run_bench
from idemstore.bench.scenarios import SCENARIOS, STORE_SCENARIOS

__all__ = [
    "SCENARIOS",
    "STORE_SCENARIOS",
    "BenchConfig",
    "BenchResult",
    "Measurement",
    "Target",
    "Timing",
    "Unavailable",
    "bench",
    "run_bench",
]
