#!/usr/bin/env python3
"""A faithful minimal equivalent of Horovod's rendezvous server, for side-by-side
benchmarks only: http.server's ThreadingHTTPServer (a thread per request, HTTP/1.0,
socketserver's default listen backlog), the same PUT/GET/DELETE handling on an
in-memory {scope: {key: bytes}} under one lock.

usage: horovod_like_server.py PORT"""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CACHE = {}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def _split(self):
        parts = self.path.split("/")
        if len(parts) < 3:
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        _, scope, key = parts  # more parts raise, as Horovod's handler does
        return scope, key

    def do_GET(self):
        sk = self._split()
        if sk is None:
            return
        with LOCK:
            value = CACHE.get(sk[0], {}).get(sk[1])
        if value is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(value)))
        self.end_headers()
        self.wfile.write(value)

    def do_PUT(self):
        sk = self._split()
        if sk is None:
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with LOCK:
            CACHE.setdefault(sk[0], {})[sk[1]] = body
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        sk = self._split()
        if sk is None:
            return
        with LOCK:
            CACHE.get(sk[0], {}).pop(sk[1], None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
