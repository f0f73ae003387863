"""Doors for work that arrives as messages or tasks: Celery (``idemstore.consumers.celery``)."""
