"""A replica for the services' tests: stdlib HTTP on $PORT, one thread per request.

GET /health    200 (503 with NEVER_READY=1: a service that never becomes ready)
GET /          {"pid": ..., "port": ..., "version": $APP_VERSION}
GET /slow?s=X  the same after X seconds (load for the autoscaler)
GET /stream    three server-sent events, 0.2 s apart
POST /echo     the body back
Writes its pid to $PID_DIR/<port>.pid so a test can kill it with -9.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

PORT = int(os.environ["PORT"])
VERSION = os.environ.get("APP_VERSION", "1")
NEVER_READY = os.environ.get("NEVER_READY") == "1"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 65536  # headers and body in one write (flushed after each request): no Nagle stall

    def log_message(self, *_: object) -> None:
        pass

    def _json(self, body: dict[str, object], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        me = {
            "pid": os.getpid(),
            "port": PORT,
            "version": VERSION,
            "path": self.path,
            "prefix": self.headers.get("X-Forwarded-Prefix"),
            "auth": self.headers.get("Authorization"),
        }
        if url.path == "/health":
            self._json({"ok": not NEVER_READY}, 503 if NEVER_READY else 200)
        elif url.path == "/slow":
            time.sleep(float(parse_qs(url.query).get("s", ["0.5"])[0]))
            self._json(me)
        elif url.path == "/gzip":
            data = gzip.compress(json.dumps(me).encode())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif url.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                chunk = f"data: {i} {time.time()}\n\n".encode()
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._json(me)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        self._json({"echo": body.decode(), "port": PORT, "version": VERSION})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    pid_dir = os.environ.get("PID_DIR")
    if pid_dir:
        Path(pid_dir, f"{PORT}.pid").write_text(str(os.getpid()))
    print(f"serving on {PORT}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
