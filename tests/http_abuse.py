"""Hostile HTTP clients for the server abuse tests: raw sockets that declare bodies they never
send, bodies streamed until the server hangs up, chunked bodies, and a server started as a real
process whose memory can be read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx


@dataclass(frozen=True)
class RawReply:
    status: int
    body: dict
    sent: int
    """Body bytes the client managed to send before the reply (the server read at most that)."""
    wait_s: float


def _connect(url: str) -> socket.socket:
    u = urlsplit(url)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.settimeout(10)
    return s


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_reply(s: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"server closed without a reply: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                   if ln.lower().startswith(b"content-length:")), None)
    while length is not None and len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, json.loads(rest) if rest.strip().startswith(b"{") else {"raw": rest.decode()}


def declared_but_unsent(url: str, path: str, declared: int, headers: dict[str, str] | None = None,
                        method: str = "POST") -> RawReply:
    """Declare a ``declared``-byte JSON body and send none of it: a server that waits for the
    body before answering times out here (10 s) instead of replying."""
    t0 = time.monotonic()
    with _connect(url) as s:
        s.sendall(_head(method, path, {"Content-Type": "application/json",
                                       "Content-Length": str(declared), **(headers or {})}))
        status, body = _read_reply(s)
    return RawReply(status, body, 0, time.monotonic() - t0)


def stream_until_refused(url: str, path: str, total: int, headers: dict[str, str] | None = None,
                         chunked: bool = False) -> RawReply:
    """Send a ``total``-byte body (declared, or chunked) as fast as the server takes it; stop when
    it replies or hangs up, then read the reply."""
    t0 = time.monotonic()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    hdrs |= {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total)}
    block = b"[" + b"1," * (1 << 19)  # ~1 MiB of valid-looking JSON
    sent = 0
    with _connect(url) as s:
        s.sendall(_head("POST", path, hdrs))
        s.settimeout(0.5)
        try:
            while sent < total:
                piece = block[: min(len(block), total - sent)]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server stopped reading: its reply is waiting
        s.settimeout(10)
        status, body = _read_reply(s)
    return RawReply(status, body, sent, time.monotonic() - t0)


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(val.split()[0])
    return out


def start_process(code: str, args: list[str], health_url: str,
                  timeout_s: float = 60) -> subprocess.Popen:
    """``python -c code *args`` (a CLI sub-app), waiting until ``health_url`` answers 200."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not come up: {proc.stdout.read()}")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
