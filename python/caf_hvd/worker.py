"""The rank side of an executor: `python -m caf_hvd.worker`, started by caf-hvd with its
frame channel on the descriptor named by CAF_HVD_CHANNEL_FD. It answers calls in order:
the boot call (id 0) builds the executable or runs an elastic worker function, later
calls run functions on it. Every answer is ("ok", value) or ("err", type, message,
traceback), pickled; caf-hvd relays the bytes without reading them."""

import os
import pickle
import socket
import sys
import traceback

import cloudpickle

from caf_hvd import _frames

from caf_hvd import _runtime


def _error(exc):
    return ("err", type(exc).__name__, str(exc),
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _encode(answer, max_frame):
    try:
        data = cloudpickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - any pickling failure is the caller's to see
        data = cloudpickle.dumps(("err", "PicklingError",
                                  f"the value returned cannot be pickled: {e}",
                                  traceback.format_exc()))
    if len(data) > max_frame:
        data = cloudpickle.dumps(("err", "ValueError",
                                  f"the value returned is {len(data)} bytes pickled, over the "
                                  f"frame limit of {max_frame} bytes (--executor-max-frame-mb)",
                                  ""))
    return data


def main():
    fd = int(os.environ["CAF_HVD_CHANNEL_FD"])
    max_frame = int(os.environ.get("CAF_HVD_MAX_FRAME", 256 << 20))
    os.set_inheritable(fd, False)  # the user's subprocesses do not get the channel
    sock = socket.socket(fileno=fd)
    channel = _runtime.Channel(sock, max_frame)
    _runtime.channel = channel
    frames = _frames.Reader(sock, max_frame)
    executable = None
    code = 0
    while True:
        try:
            f = frames.read()
        except (_frames.FrameError, OSError) as e:
            print(f"caf_hvd worker: channel broken: {e}", file=sys.stderr, flush=True)
            break
        if f is None:
            break  # caf-hvd closed the channel: the executor shuts down
        kind, ident, _, _, payload = f
        if kind != _frames.CALL:
            print(f"caf_hvd worker: unexpected {_frames.KIND_NAMES.get(kind, kind)} frame",
                  file=sys.stderr, flush=True)
            break
        channel.call = ident
        op = None
        try:
            op, fn, args, kwargs = cloudpickle.loads(payload)
            if op == "init":
                executable = fn(*args, **kwargs) if fn is not None else None
                value = None
            elif op == "execute":
                value = fn(executable)
            elif op == "run":
                value = fn(*args, **kwargs)
            elif op == "elastic":  # (worker_fn, executable class spec)
                cls, cargs, ckwargs = args
                if cls is not None:
                    executable = cls(*cargs, **ckwargs)
                    value = fn(executable)
                else:
                    value = fn()
            else:
                raise ValueError(f"unknown executor operation {op!r}")
            answer = ("ok", value)
        except BaseException as e:  # noqa: BLE001 - SystemExit in user code is an error too
            answer = _error(e)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            channel.send(_frames.RESULT, ident, _encode(answer, max_frame))
        except OSError as e:
            print(f"caf_hvd worker: cannot send the result of call {ident}: {e}",
                  file=sys.stderr, flush=True)
            break
        if op == "elastic":
            # an elastic worker's process ends with its function; a raise is a failure
            code = 0 if answer[0] == "ok" else 1
            if code:
                print(answer[3] or f"{answer[1]}: {answer[2]}", file=sys.stderr, end="")
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads of the user's code (torch, gloo) do not hold the rank


if __name__ == "__main__":
    main()
