"""WSGI apps the middleware tests wrap: a Flask API with a side-effect counter."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import flask

from idemstore.http.wsgi import IdempotencyMiddleware

if TYPE_CHECKING:
    from collections.abc import Iterator


def orders_app(effects: Path | None = None) -> flask.Flask:
    """``POST /orders`` counts its side effect (in memory, and as a line with the request's
    key in ``effects`` when given: several server processes share that file), echoing the
    order with its number. ``?sleep=S`` makes the work take S seconds; ``/broken`` answers
    503."""
    app = flask.Flask("orders")
    lock = threading.Lock()
    app.config["count"] = 0

    @app.post("/orders")
    def create() -> tuple[dict[str, Any], int]:
        with lock:
            app.config["count"] += 1
            number = app.config["count"]
        if effects is not None:
            with effects.open("a") as out:
                key = flask.request.headers.get("Idempotency-Key", "")
                out.write(f"{key} {os.getpid()}\n")
        time.sleep(float(flask.request.args.get("sleep", "0")))
        return {"order": flask.request.get_json(silent=True), "number": number}, 201

    @app.post("/broken")
    def broken() -> tuple[str, int]:
        app.config["count"] += 1
        return "try later", 503

    def effect() -> int:
        with lock:
            app.config["count"] += 1
            number: int = app.config["count"]
        if effects is not None:
            with effects.open("a") as out:
                key = flask.request.headers.get("Idempotency-Key", "")
                out.write(f"{key} {os.getpid()}\n")
        return number

    @app.post("/ticks")
    def ticks() -> flask.Response:
        """``?events=`` server-sent events, ``?delay=`` seconds apart (a WSGI iterable);
        ``?cut=N``: the iterable fails after N events."""
        number = effect()
        count = int(flask.request.args.get("events", "50"))
        delay = float(flask.request.args.get("delay", "0"))
        cut = int(flask.request.args.get("cut", "-1"))

        def events() -> Iterator[bytes]:
            for i in range(count):
                if i == cut:
                    raise RuntimeError("the stream broke")
                yield f"id: {i}\nevent: tick\ndata: execution {number} tick {i}\n\n".encode()
                time.sleep(delay)

        return flask.Response(events(), mimetype="text/event-stream")

    @app.post("/big")
    def big() -> flask.Response:
        effect()
        return flask.Response(b"x" * int(flask.request.args.get("size", "100")))

    @app.get("/orders")
    def listing() -> dict[str, int]:
        return {"count": app.config["count"]}

    return app


def gunicorn_app() -> Any:
    """The app gunicorn serves (``tests.wsgi.apps:gunicorn_app()``): the store and the
    effects file come from the environment."""
    app = orders_app(Path(os.environ["IDEMSTORE_TEST_EFFECTS"]))
    app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, store=os.environ["IDEMSTORE_TEST_STORE"]
    )
    return app
