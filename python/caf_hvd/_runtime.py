"""State of a process that serves an executor as one of its ranks."""

import threading

import cloudpickle

from caf_hvd import _frames

channel = None  # the Channel while this process serves an executor


class Channel:
    def __init__(self, sock, max_frame):
        self.sock = sock
        self.max_frame = max_frame
        self.lock = threading.Lock()
        self.call = 0  # the call being run (log records carry it)

    def send(self, kind, ident, payload):
        with self.lock:
            self.sock.sendall(_frames.encode(kind, ident, 0, payload))


def log(record):
    """Sends `record` (a dict) from a worker to the driver program's callbacks, in order
    per rank (Horovod's ray_logger)."""
    if channel is None:
        raise RuntimeError("caf_hvd.log() works only inside an executor's worker")
    if not isinstance(record, dict):
        raise TypeError(f"caf_hvd.log() takes a dict, not {type(record).__name__}")
    payload = cloudpickle.dumps((channel.call, record))
    if len(payload) > channel.max_frame:
        raise ValueError(f"log record of {len(payload)} bytes is over the frame limit of "
                         f"{channel.max_frame} bytes")
    channel.send(_frames.LOG, 0, payload)
