"""One racing process for the sync runner: run as a module, it runs every key given from a few
threads through ``idemstore.sync.Idempotency`` and prints one JSON line per execution and per
result (``tests/process_race.py`` gathers such lines)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main(url: str, threads_per_key: int, work_seconds: float, keys: list[str]) -> None:
    from idemstore import fingerprint
    from idemstore.sync import Idempotency

    pid = os.getpid()
    printing = threading.Lock()

    def emit(event: dict[str, str | int]) -> None:
        with printing:
            print(json.dumps(event), flush=True)

    with Idempotency(url, lease_ttl=30) as idem:

        def one(key: str) -> None:
            def work() -> bytes:
                emit({"exec": key, "pid": pid})
                time.sleep(work_seconds)
                return f"{key} by {pid}".encode()

            result = idem.run(key, fingerprint({"key": key}), work)
            emit({"result": key, "value": result.value.decode()})

        threads = [
            threading.Thread(target=one, args=(key,))
            for key in keys
            for _ in range(threads_per_key)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


if __name__ == "__main__":
    url, threads, seconds, *race_keys = sys.argv[1:]
    main(url, int(threads), float(seconds), race_keys)
