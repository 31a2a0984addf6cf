#!/usr/bin/env python3
"""A byte-counting, rate-capping TCP proxy on loopback: the throttled capacity tier of the peer
benchmark.

    benches/peers/proxy.py --target 127.0.0.1:3900 --rate 41943040 --stats FILE [--port 0]

It accepts connections on 127.0.0.1:PORT (0 picks a free port), prints `listening PORT` on
stdout once it accepts, and relays each connection to TARGET. Every byte from the server to the
clients (GET bodies, listings, headers) goes through one token bucket shared by all connections,
so the tier as a whole delivers at most RATE bytes/s whatever the number of connections, as a
shared parallel file system or a WAN link to an object store would. Bytes each way are counted
and written to FILE as JSON (`{"down": N, "up": N, "connections": N}`) whenever they change, at
most every 50 ms; a reader takes the difference of two snapshots. TCP_NODELAY is set on both
sides, so the proxy adds no delay of its own to small responses. It exits on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import time

CHUNK = 64 * 1024


class Bucket:
    """A token bucket as a virtual clock: each chunk is scheduled `n / rate` after the previous
    one; a sender that is ahead of the clock sleeps. Up to `burst` bytes may go at once after
    an idle spell."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst_s = burst / rate
        self.next = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(self.next, now - self.burst_s)
        self.next = start + n / self.rate
        if self.next > now + self.burst_s:
            await asyncio.sleep(self.next - now - self.burst_s)


class Stats:
    def __init__(self, path: str) -> None:
        self.path = path
        self.c = {"down": 0, "up": 0, "connections": 0}
        self.dirty = True

    def write(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.c, f)
        os.replace(tmp, self.path)
        self.dirty = False

    async def writer(self) -> None:
        while True:
            if self.dirty:
                self.write()
            await asyncio.sleep(0.05)


def nodelay(w: asyncio.StreamWriter) -> None:
    s = w.get_extra_info("socket")
    if s is not None:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument(
        "--rate",
        type=float,
        required=True,
        help="bytes/s from the server, all connections together",
    )
    ap.add_argument("--stats", required=True)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"proxy.py: --target {a.target}: only loopback targets are accepted")
    bucket = Bucket(a.rate, 256 * 1024)
    stats = Stats(a.stats)

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, key: str, paced: bool) -> None:
        try:
            while True:
                data = await r.read(CHUNK)
                if not data:
                    break
                if paced:
                    await bucket.take(len(data))
                stats.c[key] += len(data)
                stats.dirty = True
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                w.close()
            except Exception:
                pass

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        stats.c["connections"] += 1
        try:
            sr, sw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.close()
            return
        nodelay(cw)
        nodelay(sw)
        try:
            await asyncio.gather(pipe(cr, sw, "up", False), pipe(sr, cw, "down", True))
        except asyncio.CancelledError:
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", a.port)
    stats.write()
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    w = asyncio.create_task(stats.writer())
    async with server:
        await stop.wait()
    w.cancel()
    stats.write()


if __name__ == "__main__":
    asyncio.run(main())
