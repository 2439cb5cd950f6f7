"""The wire format between ``VLLMEngine`` and its worker process (``vllm_worker.py``).

One frame = an 8-byte header (JSON length, blob length: two big-endian uint32) + a JSON object +
an optional binary blob (a safetensors file: new weights). Standard library only, and imported by
both sides: the worker runs in vLLM's own venv, where looprl is not installed, so it loads this
file by path. No pickle crosses the boundary: a frame cannot run code in the process reading it.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">II")


def send(sock: socket.socket, msg: dict[str, Any], blob: bytes = b"") -> None:
    """Write one frame (callers serialise writers: frames of two threads must not interleave)."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body), len(blob)) + body)
    if blob:
        sock.sendall(blob)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the peer closed the vLLM worker connection")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """Read one frame: (message, blob). Raises ``EOFError`` when the peer is gone."""
    n_json, n_blob = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    msg = json.loads(_read_exact(sock, n_json))
    return msg, _read_exact(sock, n_blob) if n_blob else b""
