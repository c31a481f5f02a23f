"""A local HTTP server on 127.0.0.1 that plays the remote image host in API tests.

Paths: `/image.png` (a real PNG), `/big` (more bytes than a test's cap, no Content-Length),
`/big-declared` (a huge Content-Length), `/slow` (one byte every 0.2 s), `/redirect?to=URL`
(a 302 to URL), `/cut-short` (fewer bytes than its Content-Length), `/bad-gzip` (a body its
Content-Encoding does not decode), anything else 404. Every request path is recorded in `.requests`.
"""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

BIG_BYTES = 256 * 1024


class ImageServer:
    def __init__(self, image: bytes):
        self.image = image
        self.requests: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="test-image-server")

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> "ImageServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                server.requests.append(self.path)
                parts = urlsplit(self.path)
                try:
                    self.route(parts.path, parse_qs(parts.query))
                except (BrokenPipeError, ConnectionResetError):  # the API gave up on us: expected in tests
                    pass

            def route(self, path: str, query: dict) -> None:
                if path == "/image.png":
                    self.reply(200, server.image, {"Content-Type": "image/png", "Content-Length": str(len(server.image))})
                elif path == "/big":
                    self.reply(200, b"\0" * BIG_BYTES, {"Content-Type": "image/png"})
                elif path == "/big-declared":
                    self.reply(200, b"", {"Content-Type": "image/png", "Content-Length": str(10**12)})
                elif path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.end_headers()
                    for _ in range(100):
                        self.wfile.write(b"\0")
                        self.wfile.flush()
                        time.sleep(0.2)
                elif path == "/cut-short":
                    self.reply(200, server.image[:100], {"Content-Type": "image/png", "Content-Length": "5000"})
                    self.close_connection = True
                elif path == "/bad-gzip":
                    self.reply(200, b"\x1f\x8b\x08\x00" + bytes(60), {"Content-Type": "image/png",
                                                                      "Content-Encoding": "gzip", "Content-Length": "64"})
                elif path == "/redirect":
                    self.reply(302, b"", {"Location": query["to"][0], "Content-Length": "0"})
                else:
                    self.reply(404, b"not found", {"Content-Length": "9"})

            def reply(self, status: int, body: bytes, headers: dict) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler
