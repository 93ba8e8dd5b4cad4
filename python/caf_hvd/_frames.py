"""Executor frames as caf-hvd defines them (docs/executors.md, "Executor frames"): a 24-byte
big-endian header (kind u8, three zero bytes, id u64, rank u32, deadline_ms u32,
payload length u32) and an opaque payload."""

import struct

HEADER = struct.Struct(">B3xQIII")
ALL_RANKS = 0xFFFFFFFF

CALL, RESULT, LOG, FAILED = 1, 2, 3, 4
START, SHUTDOWN, RANKS, END, KILL_HOST = 16, 17, 18, 19, 20

KIND_NAMES = {CALL: "call", RESULT: "result", LOG: "log", FAILED: "failed", START: "start",
              SHUTDOWN: "shutdown", RANKS: "ranks", END: "end", KILL_HOST: "kill_host"}


class FrameError(Exception):
    """The stream broke the frame format."""


def encode(kind, ident=0, rank=0, payload=b"", deadline_ms=0):
    return HEADER.pack(kind, ident, rank, deadline_ms, len(payload)) + payload


class Reader:
    """Frames from a socket that only this reader reads. One recv takes whatever has
    arrived, so a burst of small frames (eight ranks' answers) costs one system call, not
    two per frame."""

    CHUNK = 1 << 16

    def __init__(self, sock, max_payload=256 << 20):
        self.sock = sock
        self.max_payload = max_payload
        self.buf = bytearray()

    def read(self):
        """One frame as (kind, id, rank, deadline_ms, payload), or None at a clean end of
        stream. Raises FrameError for a cut-off or malformed frame."""
        while len(self.buf) < HEADER.size:
            chunk = self.sock.recv(self.CHUNK)
            self.buf += chunk
            if not chunk:
                if not self.buf:
                    return None
                raise FrameError(f"the stream ended inside a frame header ({len(self.buf)} of "
                                 f"{HEADER.size} bytes)")
        if self.buf[1:4] != b"\0\0\0":
            raise FrameError("frame with non-zero reserved bytes")
        kind, ident, rank, deadline, length = HEADER.unpack_from(self.buf)
        if kind not in KIND_NAMES:
            raise FrameError(f"unknown frame kind {kind}")
        if length > self.max_payload:
            raise FrameError(f"{KIND_NAMES[kind]} frame of {length} bytes is over the limit "
                             f"of {self.max_payload} bytes")
        end = HEADER.size + length
        if len(self.buf) >= end:
            payload = bytes(self.buf[HEADER.size:end])
            del self.buf[:end]
            return kind, ident, rank, deadline, payload
        # the rest of the payload: received in large pieces, joined once
        chunks = [bytes(self.buf[HEADER.size:])]
        have = len(chunks[0])
        self.buf.clear()
        while have < length:
            chunk = self.sock.recv(min(length - have, 1 << 22))
            if not chunk:
                raise FrameError(f"the stream ended inside a {KIND_NAMES[kind]} frame ({have} "
                                 f"of {length} payload bytes)")
            chunks.append(chunk)
            have += len(chunk)
        return kind, ident, rank, deadline, b"".join(chunks)
