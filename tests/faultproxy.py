#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 proxy on loopback, for testing metfs against a flaky S3 endpoint.

    tests/faultproxy.py --target 127.0.0.1:3900 [--port 0] [--seed 1] \
        [--slowdown 0.1] [--reset 0.1] [--reset-within 262144] \
        [--max-seconds 600] [--stats FILE] [--dead-keys FILE]

It accepts connections on 127.0.0.1:PORT (0 picks a free port), prints
`listening 127.0.0.1:PORT` on stdout once it accepts, and relays each connection to TARGET. The
client-to-server direction is parsed into requests (head plus a Content-Length body; requests
are not pipelined by S3 clients, so a new request head means the previous response is complete).
For each request, a random draw decides:

* with probability SLOWDOWN: the request is not forwarded; the client gets
  `HTTP/1.1 503 Slow Down` with an S3 `SlowDown` error body, and the connection is closed;
* with probability RESET: the request is forwarded, and the connection is reset (TCP RST) after
  a random number of response bytes in [0, RESET_WITHIN), which usually cuts a response body
  in the middle;
* otherwise the request and its response pass through untouched.

With --dead-keys FILE (a fault that lasts: a dead replica, a throttled prefix), every `GET`
whose path ends in one of FILE's lines (object keys, one per line, as they appear in the
request path) is answered `503 Slow Down` for as long as FILE holds that line; the file is
read again at each request, so emptying or deleting it ends the fault. Such answers count as
`dead_key_503s`, and take no random draw.

Draws come from a generator seeded with (SEED, connection number), so a given seed makes the same
decisions for the same sequence of connections. The proxy exits after MAX_SECONDS (so a forgotten
proxy cannot outlive a test run) or on SIGTERM / SIGINT. With --stats, the counters are written to
FILE as JSON after every injected fault, every listing request and at exit, so a test can check
that faults happened and count listings: `list_pages` counts every `ListObjectsV2` request
(`list-type=2`), `listings` those that start a listing (no `continuation-token`).
Only loopback targets are accepted.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import struct
import sys

SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<Resource>/</Resource><RequestId>faultproxy</RequestId></Error>"
)
SLOWDOWN = (
    b"HTTP/1.1 503 Slow Down\r\n"
    b"Content-Type: application/xml\r\n"
    b"Content-Length: " + str(len(SLOWDOWN_BODY)).encode() + b"\r\n"
    b"Connection: close\r\n"
    b"\r\n" + SLOWDOWN_BODY
)
MAX_HEAD = 64 * 1024


class Stats:
    def __init__(self, path):
        self.path = path
        self.counts = {
            "connections": 0,
            "requests": 0,
            "slowdowns": 0,
            "resets": 0,
            "list_pages": 0,
            "listings": 0,
            "dead_key_503s": 0,
        }

    def bump(self, key):
        self.counts[key] += 1
        if key in ("slowdowns", "resets", "list_pages", "listings", "dead_key_503s"):
            self.write()

    def write(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.counts, f)
        os.replace(tmp, self.path)


def reset(writer):
    """Closes a connection with a TCP RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def content_length(head):
    """The Content-Length of a request head, 0 when absent; None for chunked bodies."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return None
        if name == b"content-length":
            return int(value.strip())
    return 0


class Proxy:
    def __init__(self, args, stats):
        self.args = args
        self.stats = stats
        self.conn_no = 0
        host, _, port = args.target.rpartition(":")
        self.target = (host, int(port))

    def dead(self, line):
        """Whether the request `line` is a GET of a key --dead-keys names now."""
        if not self.args.dead_keys or not line.startswith(b"GET "):
            return False
        try:
            with open(self.args.dead_keys, "rb") as f:
                keys = [k.strip() for k in f.read().splitlines() if k.strip()]
        except FileNotFoundError:
            return False
        path = line.split(b" ")[1].split(b"?")[0]
        return any(path.endswith(b"/" + k) for k in keys)

    async def handle(self, client_r, client_w):
        self.conn_no += 1
        rng = random.Random(f"{self.args.seed}:{self.conn_no}")
        self.stats.bump("connections")
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            # Target down: the client sees the connection dropped, as it would without a proxy.
            reset(client_w)
            return
        state = {"sent": 0, "reset_at": None, "done": False}

        async def downstream():
            try:
                while True:
                    data = await server_r.read(65536)
                    if not data:
                        break
                    limit = state["reset_at"]
                    if limit is not None and state["sent"] + len(data) >= limit:
                        cut = limit - state["sent"]
                        if cut > 0:
                            client_w.write(data[:cut])
                            await client_w.drain()
                        self.stats.bump("resets")
                        state["done"] = True
                        reset(client_w)
                        server_w.close()
                        return
                    client_w.write(data)
                    state["sent"] += len(data)
                    await client_w.drain()
            except (ConnectionError, OSError):
                pass
            state["done"] = True
            client_w.close()

        down = asyncio.create_task(downstream())
        buf = b""
        try:
            while not state["done"]:
                while b"\r\n\r\n" not in buf:
                    data = await client_r.read(65536)
                    if not data:
                        return
                    buf += data
                    if len(buf) > MAX_HEAD and b"\r\n\r\n" not in buf:
                        reset(client_w)
                        return
                head, _, buf = buf.partition(b"\r\n\r\n")
                head += b"\r\n\r\n"
                self.stats.bump("requests")
                line = head.split(b"\r\n", 1)[0]
                if b"list-type=2" in line:
                    self.stats.bump("list_pages")
                    if b"continuation-token" not in line:
                        self.stats.bump("listings")
                if self.dead(line):
                    down.cancel()
                    server_w.close()
                    client_w.write(SLOWDOWN)
                    await client_w.drain()
                    client_w.close()
                    self.stats.bump("dead_key_503s")
                    return
                draw = rng.random()
                if draw < self.args.slowdown:
                    down.cancel()
                    server_w.close()
                    client_w.write(SLOWDOWN)
                    await client_w.drain()
                    client_w.close()
                    self.stats.bump("slowdowns")
                    return
                if draw < self.args.slowdown + self.args.reset:
                    state["reset_at"] = state["sent"] + rng.randrange(
                        0, max(1, self.args.reset_within)
                    )
                server_w.write(head)
                length = content_length(head)
                if length is None:
                    # A chunked upload: relay the rest of the connection untouched.
                    server_w.write(buf)
                    while True:
                        data = await client_r.read(65536)
                        if not data:
                            return
                        server_w.write(data)
                        await server_w.drain()
                body, buf = buf[:length], buf[length:]
                server_w.write(body)
                remaining = length - len(body)
                while remaining > 0:
                    data = await client_r.read(min(65536, remaining))
                    if not data:
                        return
                    server_w.write(data)
                    remaining -= len(data)
                await server_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if state["done"]:
                down.cancel()
            else:
                # The client closed its side: let the response finish, then close.
                try:
                    server_w.write_eof()
                except (OSError, RuntimeError):
                    pass
                try:
                    await asyncio.wait_for(down, timeout=30)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    pass
            server_w.close()


async def main(args):
    host, _, _ = args.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("faultproxy: only loopback targets are allowed")
    stats = Stats(args.stats)
    stats.write()
    proxy = Proxy(args, stats)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.port)
    port = server.sockets[0].getsockname()[1]
    print(f"listening 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), timeout=args.max_seconds)
    except asyncio.TimeoutError:
        print("faultproxy: time limit reached, exiting", file=sys.stderr)
    server.close()
    stats.write()
    print(json.dumps(stats.counts), file=sys.stderr)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the server (loopback only)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slowdown", type=float, default=0.1, help="fraction of requests answered 503")
    p.add_argument(
        "--reset", type=float, default=0.1, help="fraction of requests whose connection is reset"
    )
    p.add_argument(
        "--reset-within",
        type=int,
        default=256 * 1024,
        help="the reset comes after a uniform [0, N) response bytes",
    )
    p.add_argument("--max-seconds", type=float, default=600, help="exit after this long")
    p.add_argument("--stats", help="write fault counters (JSON) to this file")
    p.add_argument("--dead-keys", help="answer 503 to GETs of the keys this file lists")
    asyncio.run(main(p.parse_args()))
