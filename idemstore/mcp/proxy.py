"""A stdio relay that deduplicates ``tools/call`` in front of any unmodified MCP server.

Every message passes byte-for-byte in both directions, except ``tools/call`` requests that carry
or get an idempotency key (and their responses), and the ``initialize`` / ``server/discover``
results, where ``capabilities.tools.idempotency = {}`` is added. Lines are parsed with
``json.loads`` only to decide; anything relayed is the original bytes.

This module is the stdio transport only: reading and writing lines, matching responses to
requests, starting the server process. What happens to a ``tools/call`` (which key, which
scope, replay, conflict, in-flight, cancellation, what is recorded) is
``idemstore.mcp.tool_calls.ToolCallCore``, which a Streamable HTTP gateway shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hashlib
import json
import logging
import os
import signal
import stat
import sys
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError
from idemstore.mcp import sep3182
from idemstore.mcp.lines import CHUNK, ByteReader, ByteWriter, LineReader, LineTooLong, written
from idemstore.mcp.tool_calls import (
    Answer,
    RelayOptions,
    ServerGone,
    ServerResponse,
    ToolCall,
    ToolCallCore,
    decoded,
    error_line,
    id_key,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator, Sequence

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "IdempotentProxy",
    "default_key_scope",
    "run_stdio_proxy",
]

logger = logging.getLogger("idemstore.mcp.proxy")

_DEFAULT_MAX_LINE = 256 * 1024 * 1024


class _Answer:
    """A forwarded call's answer to await; its entry among the awaited responses goes once
    it is awaited (answered, or given up on). Not a coroutine: an answer never awaited (the
    relay stopped first) warns of nothing."""

    __slots__ = ("_future", "_key", "_responses")

    def __init__(
        self,
        future: asyncio.Future[ServerResponse],
        key: str,
        responses: dict[str, asyncio.Future[ServerResponse]],
    ) -> None:
        self._future = future
        self._key = key
        self._responses = responses

    def __await__(self) -> Generator[Any, None, ServerResponse]:
        try:
            return (yield from self._future.__await__())
        finally:
            if self._responses.get(self._key) is self._future:
                del self._responses[self._key]


class IdempotentProxy:
    """Relay one MCP client and one MCP server, deduplicating ``tools/call`` through ``store``.

    Args:
        store: any ``IdempotencyStore`` (shared ones let several proxies deduplicate together).
        options: the deduplication policy (``RelayOptions``: run id, lease, retentions,
            in-flight policy, which tools get derived keys, cancel grace, takeover policy), or
            its fields as keyword arguments (``lease_ttl=...``, ``run_id=...``). Proxies that
            share a store and a run id deduplicate implicit calls between them; ``retention``
            defaults to 600 s, as mcp-idempotent's ``--ttl-ms``.
        key_scope: scope of explicit keys (SEP-3182 and ``_meta``); see ``default_key_scope``.
        max_line_bytes: longest message accepted; a longer one is skipped and answered with an
            error.

    Example:
        ```python
        async with open_store("memory://") as store:
            proxy = IdempotentProxy(store)
            await proxy.run(client_reader=r1, client_writer=w1,
                            server_reader=r2, server_writer=w2)
        ```
    """

    __slots__ = (
        "_client_lock",
        "_client_writer",
        "_core",
        "_lease_ttl",
        "_max_line",
        "_responses",
        "_server_closed",
        "_server_lock",
        "_server_writer",
        "client_closed",
        "run_id",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        options: RelayOptions | None = None,
        *,
        key_scope: str = "mcp-proxy/keys",
        max_line_bytes: int = _DEFAULT_MAX_LINE,
        **fields: Any,
    ) -> None:
        if max_line_bytes < 1:
            raise ConfigurationError(f"max_line_bytes must be positive, not {max_line_bytes!r}")
        if options is None:
            options = RelayOptions(**fields)
        elif fields:
            raise ConfigurationError("give RelayOptions or its fields, not both")
        self._core = ToolCallCore(store, options, key_scope=key_scope)
        self.run_id = self._core.run_id
        self._lease_ttl = options.lease_ttl
        self._max_line = max_line_bytes
        self._responses: dict[str, asyncio.Future[ServerResponse]] = {}
        self._client_writer: ByteWriter | None = None
        self._server_writer: ByteWriter | None = None
        self._client_lock = asyncio.Lock()
        self._server_lock = asyncio.Lock()
        self._server_closed = False
        self.client_closed = asyncio.Event()
        """Set once the client's stream ended and the server's input was closed."""

    async def run(
        self,
        *,
        client_reader: ByteReader,
        client_writer: ByteWriter,
        server_reader: ByteReader,
        server_writer: ByteWriter,
    ) -> None:
        """Relay until the server's output ends; then answer what is pending and return.

        When the client's stream ends first, the server's input is closed once every
        intercepted call has been forwarded or answered, and the relay goes on until the
        server's output ends.
        """
        self._client_writer = client_writer
        self._server_writer = server_writer
        client = asyncio.create_task(self._pump_client(client_reader), name="mcp-proxy:client")
        try:
            await self._pump_server(server_reader)
        finally:
            self._server_closed = True
            # Calls waiting for the server get "server gone" (their keys are released);
            # calls still reserving or waiting find the server closed when they forward.
            for future in self._responses.values():
                if not future.done():
                    future.set_exception(ServerGone())
            client.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client
            calls = self._core.tasks
            if calls:
                await asyncio.wait(calls, timeout=self._lease_ttl)
            await self._core.close()
            await asyncio.gather(*self._core.tasks, return_exceptions=True)

    # -- client to server -----------------------------------------------------------------

    async def _relay_lines(
        self,
        reader: ByteReader,
        side: str,
        on_line: Callable[[bytes], Awaitable[None]],
        on_too_long: Callable[[], Awaitable[None]],
    ) -> None:
        """Each line ``side`` sends to ``on_line``, until EOF; ``on_too_long`` for a line past
        the limit (skipped whole)."""
        lines = LineReader(reader, self._max_line)
        while True:
            try:
                line = await lines.readline()
            except LineTooLong:
                await on_too_long()
                continue
            if not line:
                return
            try:
                await on_line(line)
            except Exception:
                # Whatever a message holds, the relay goes on.
                logger.exception("could not handle a %s message; it was dropped", side)

    async def _pump_client(self, reader: ByteReader) -> None:
        await self._relay_lines(reader, "client", self._on_client_line, self._client_too_long)
        await self._core.wait_forwarded()
        if self._server_writer is not None:
            with contextlib.suppress(Exception):
                self._server_writer.close()
        self.client_closed.set()

    async def _client_too_long(self) -> None:
        logger.warning("skipped a client message over %d bytes", self._max_line)
        why = f"message larger than {self._max_line} bytes"
        await self._send_client(error_line(None, sep3182.error(sep3182.INVALID_REQUEST, why)))

    async def _on_client_line(self, line: bytes) -> None:
        try:
            await self._relay_client_line(line)
        except ServerGone:
            logger.debug("server input closed; dropped a client message")

    async def _relay_client_line(self, line: bytes) -> None:
        message = decoded(line)
        if isinstance(message, dict):
            method = message.get("method")
            has_id = "id" in message and message["id"] is not None
            if method == "tools/call" and has_id:
                verdict = self._core.prepare(message, line)
                if isinstance(verdict, ToolCall):
                    if self._core.runs_at_once:
                        post, exchange = self._exchanges(verdict)
                        await self._core.start_at_once(verdict, post, exchange, self._send_client)
                    else:
                        self._start(verdict)
                    return
                if isinstance(verdict, Answer):
                    await self._send_client(verdict.line)
                    return
                line = verdict.line
            elif has_id:
                self._core.note_request(message)
            elif method == "notifications/cancelled":
                params = message.get("params")
                target = params.get("requestId") if isinstance(params, dict) else None
                if target is not None and not self._core.cancel(target):
                    return  # the server never saw that request
        await self._send_server(line)

    def _start(self, call: ToolCall) -> None:
        self._core.start(call, self._exchanges(call)[1], self._send_client)

    def _exchanges(
        self, call: ToolCall
    ) -> tuple[
        Callable[[bytes], Awaitable[Awaitable[ServerResponse]]],
        Callable[[bytes], Awaitable[ServerResponse]],
    ]:
        """``call``'s two ways to the server: ``post`` (send now, the answer later) and
        ``exchange`` (send, and wait for the answer)."""
        key = call.id_key
        responses = self._responses

        async def post(forward: bytes) -> Awaitable[ServerResponse]:
            if self._server_closed:
                raise ServerGone
            future: asyncio.Future[ServerResponse] = asyncio.get_running_loop().create_future()
            responses[key] = future
            try:
                await self._send_server(forward)
            except BaseException:
                if responses.get(key) is future:
                    del responses[key]
                raise
            return _Answer(future, key, responses)

        async def exchange(forward: bytes) -> ServerResponse:
            return await (await post(forward))

        return post, exchange

    async def _send_server(self, data: bytes) -> None:
        failure = await written(self._server_writer, self._server_lock, data)
        if failure is not None:
            raise ServerGone from failure

    # -- server to client -----------------------------------------------------------------

    async def _pump_server(self, reader: ByteReader) -> None:
        await self._relay_lines(reader, "server", self._on_server_line, self._server_too_long)

    async def _server_too_long(self) -> None:
        logger.error("dropped a server message over %d bytes", self._max_line)

    async def _on_server_line(self, line: bytes) -> None:
        core = self._core
        if not self._responses and not core.busy:
            await self._send_client(line)  # nothing to match: do not even parse
            return
        # A call's answer is the server's own bytes: with a store in this process they go to
        # the client before the core records them (ToolCallCore.relays_first).
        relayed = core.relays_first and not core.watching
        if relayed:
            await self._send_client(line)
        message = decoded(line)
        if isinstance(message, dict) and "method" not in message and "id" in message:
            future = self._responses.pop(id_key(message["id"]), None)
            if future is not None and not future.done():
                # The core records the outcome, and answers the client unless relayed.
                future.set_result(ServerResponse(message, line, relayed))
                return
            if not relayed:
                line = core.on_response(message, line)
        if not relayed:
            await self._send_client(line)

    async def _send_client(self, data: bytes) -> None:
        if await written(self._client_writer, self._client_lock, data) is not None:
            logger.debug("client output closed; dropped %d bytes", len(data))


def default_key_scope(command: Sequence[str]) -> str:
    """The scope of explicit keys for a proxy in front of ``command``.

    Explicit keys outlive a proxy process (a client may retry through a restarted proxy, or
    through another instance sharing the store), so they are not scoped to the run id. They are
    scoped to the local user and the server command: proxies of one user in front of the same
    server share keys; other users and other servers never see them.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    server = hashlib.sha256(json.dumps(list(command)).encode("utf-8")).hexdigest()[:16]
    return f"mcp-proxy/keys/{user}/{server}"


# -- the stdio shell the CLI runs ------------------------------------------------------------


class _FileReader:
    """A blocking file descriptor read in a thread (stdin that is a regular file)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, n: int = -1, /) -> bytes:
        return await asyncio.to_thread(os.read, self._fd, n if n > 0 else CHUNK)


class _FileWriter:
    """A blocking file descriptor written in a thread (stdout that is a regular file)."""

    __slots__ = ("_fd", "_pending")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending = bytearray()

    def write(self, data: bytes, /) -> None:
        self._pending += data

    async def drain(self) -> None:
        data, self._pending = bytes(self._pending), bytearray()
        view = memoryview(data)
        while view:
            written = await asyncio.to_thread(os.write, self._fd, view)
            view = view[written:]

    def close(self) -> None:
        pass


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch ``fd``: pipes, sockets, terminals (not files, /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


async def _stdio() -> tuple[ByteReader, ByteWriter]:
    loop = asyncio.get_running_loop()
    reader: ByteReader
    writer: ByteWriter
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if _pollable(stdin):
        stream = asyncio.StreamReader(limit=CHUNK)
        pipe = os.fdopen(stdin, "rb", buffering=0, closefd=False)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
        reader = stream
    else:
        reader = _FileReader(stdin)
    if _pollable(stdout):
        pipe = os.fdopen(stdout, "wb", buffering=0, closefd=False)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    else:
        writer = _FileWriter(stdout)
    return reader, writer


def _keep_pipe_reads_on_the_heap() -> None:
    """Free one block larger than asyncio's pipe read buffer (256 KiB per read).

    glibc maps a block that large with mmap (and unmaps it once the read is copied out) until
    it has freed a mapped block of that size; from then on it serves such blocks from the
    heap. Without this, whether the relay pays mmap, mremap and munmap on every line it reads
    depends on what happened to be freed while the modules were imported.
    """
    block = bytearray(CHUNK * 4)
    del block


async def run_stdio_proxy(
    proxy: IdempotentProxy, command: Sequence[str], *, shutdown_grace: float = 5.0
) -> int:
    """Start ``command`` as the MCP server and relay this process's stdin/stdout to it.

    Returns the server's exit status (``128 + N`` when a signal N ended it). SIGINT and SIGTERM
    are passed on to the server. When the client closes stdin, the server's stdin is closed
    and it gets ``shutdown_grace`` seconds to exit before SIGTERM, then as long before SIGKILL.
    """
    if not command:
        raise ConfigurationError("no server command: idemstore proxy [options] -- CMD [ARGS ...]")
    _keep_pipe_reads_on_the_heap()
    loop = asyncio.get_running_loop()
    # The server's output comes through a pipe of our own, read straight into a StreamReader:
    # asyncio's subprocess stdout hands every read to its protocol through call_soon, one
    # more turn of the event loop on each response.
    output, server_end = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=server_end
        )
    except OSError as exc:
        os.close(output)
        raise ConfigurationError(f"cannot start the MCP server {command[0]!r}: {exc}") from None
    finally:
        os.close(server_end)  # the server holds it now: its exit is our end of input
    assert process.stdin is not None
    server_reader = asyncio.StreamReader(limit=CHUNK)
    server_output, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(server_reader),
        os.fdopen(output, "rb", buffering=0),
    )
    client_reader, client_writer = await _stdio()

    def pass_on(signum: int) -> None:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, pass_on, signum)
            handled.append(signum)

    async def stop_server() -> None:
        for step in (None, process.terminate, process.kill):
            if step is not None:
                with contextlib.suppress(ProcessLookupError):
                    step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), shutdown_grace)
                return

    async def stop_after_client() -> None:
        await proxy.client_closed.wait()
        await stop_server()

    reaper = asyncio.create_task(stop_after_client(), name="mcp-proxy:reaper")
    try:
        await proxy.run(
            client_reader=client_reader,
            client_writer=client_writer,
            server_reader=server_reader,
            server_writer=process.stdin,
        )
    finally:
        server_output.close()
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        if process.returncode is None:
            await stop_server()
        for signum in handled:
            loop.remove_signal_handler(signum)
    code = process.returncode
    assert code is not None
    return 128 - code if code < 0 else code
