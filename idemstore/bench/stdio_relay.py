"""A bare stdio relay: the floor of ``idemstore proxy``'s added latency.

``python -m idemstore.bench.stdio_relay -- COMMAND…`` runs COMMAND and copies lines between its
own stdio and COMMAND's, parsing nothing and storing nothing: what any relay process costs (two
more pipe hops and two wake-ups of a Python event loop per call) before it does any work. The
``proxy`` scenario times it beside the proxy and the server called directly.
"""

from __future__ import annotations

import asyncio
import os
import sys

__all__ = ["main"]

_LIMIT = 1 << 24  # lines up to 16 MiB, as the proxy's default


async def _copy(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    while line := await source.readline():
        target.write(line)
        await target.drain()
    target.close()


async def _relay(command: list[str]) -> int:
    # What idemstore proxy does first (_keep_pipe_reads_on_the_heap): free one block larger
    # than a pipe read, so that glibc serves the 256 KiB of each read from the heap rather
    # than mapping and unmapping it per line. A floor without it would pay costs the proxy
    # does not.
    block = bytearray(4 * 256 * 1024)
    del block
    loop = asyncio.get_running_loop()
    # The server writes into a pipe read straight into a StreamReader, as idemstore proxy
    # reads it: asyncio's subprocess stdout would add a call_soon per read to the floor.
    answers_in, server_stdout = os.pipe()
    try:
        server = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=server_stdout
        )
    finally:
        os.close(server_stdout)
    assert server.stdin is not None
    replies = asyncio.StreamReader(limit=_LIMIT)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(replies), os.fdopen(answers_in, "rb", buffering=0)
    )
    client = asyncio.StreamReader(limit=_LIMIT)
    stdin = os.fdopen(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(client), stdin)
    stdout = os.fdopen(sys.stdout.fileno(), "wb", buffering=0, closefd=False)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
    answers = asyncio.StreamWriter(transport, protocol, None, loop)
    await asyncio.gather(_copy(client, server.stdin), _copy(replies, answers))
    return await server.wait()


def main() -> int:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print("usage: python -m idemstore.bench.stdio_relay -- COMMAND...", file=sys.stderr)
        return 2
    return asyncio.run(_relay(command))


if __name__ == "__main__":
    raise SystemExit(main())
