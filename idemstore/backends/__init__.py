"""One module or package per engine, and the engine-neutral pieces they compose.

Importing this package imports no driver: ``open_store`` imports a backend (and with it its
driver) only when a URL asks for it. What every backend composes rather than rewrites:

- ``arguments``: the checks at the top of every operation, and the lease rule (a lease no
  store could have issued owns nothing, without I/O);
- ``waiting``: the one ``wait`` loop (push wake-up or capped polling, every read bounded by
  the time left);
- ``driver_errors``: a backend declares once how its driver's exceptions map onto the
  idemstore error family.
- ``envelope``: what every store does around its engine calls (the order of checks, the
  lifecycle, connecting once, ``stats``, a lost reserve's outcome), as a base class;
- ``backoff``: the one retry loop and every backoff constant.
"""
