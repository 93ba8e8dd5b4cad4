"""Executor frames as caf-hvd defines them (README: "Executor frames"): a 24-byte
big-endian header (kind u8, three zero bytes, id u64, rank u32, deadline_ms u32,
payload length u32) and an opaque payload."""

import struct

HEADER = struct.Struct(">B3xQIII")
ALL_RANKS = 0xFFFFFFFF

CALL, RESULT, LOG, FAILED = 1, 2, 3, 4
START, SHUTDOWN, RANKS, END = 16, 17, 18, 19

KIND_NAMES = {CALL: "call", RESULT: "result", LOG: "log", FAILED: "failed", START: "start",
              SHUTDOWN: "shutdown", RANKS: "ranks", END: "end"}


class FrameError(Exception):
    """The stream broke the frame format."""


def encode(kind, ident=0, rank=0, payload=b"", deadline_ms=0):
    return HEADER.pack(kind, ident, rank, deadline_ms, len(payload)) + payload


def _read_exactly(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None, sum(len(c) for c in chunks)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks), None


def read(sock, max_payload=256 << 20):
    """One frame as (kind, id, rank, deadline_ms, payload), or None at a clean end of
    stream. Raises FrameError for a cut-off or malformed frame."""
    head, got = _read_exactly(sock, HEADER.size)
    if head is None:
        if got == 0:
            return None
        raise FrameError(f"the stream ended inside a frame header ({got} of {HEADER.size} bytes)")
    if head[1:4] != b"\0\0\0":
        raise FrameError("frame with non-zero reserved bytes")
    kind, ident, rank, deadline, length = HEADER.unpack(head)
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown frame kind {kind}")
    if length > max_payload:
        raise FrameError(f"{KIND_NAMES[kind]} frame of {length} bytes is over the limit of "
                         f"{max_payload} bytes")
    payload, got = _read_exactly(sock, length) if length else (b"", None)
    if payload is None:
        raise FrameError(f"the stream ended inside a {KIND_NAMES[kind]} frame ({got} of {length} "
                         "payload bytes)")
    return kind, ident, rank, deadline, payload
