"""The store contract suite (docs/semantics.md), one behaviour per test, run on every store the
``idemstore.testing`` plugin is configured with. Every test takes the ``store`` fixture: a
fresh, empty, entered store of the target under test."""
