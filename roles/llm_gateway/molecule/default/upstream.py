"""A minimal HTTP upstream for the gateway's scenario: the gateway is nginx, and what is tested is
how it spreads, streams, fails over and checks keys, so the upstream only has to answer like an
OpenAI-style server (real vLLM replicas are behind it in the system tests of the serve phase).

    /health                     200
    POST /v1/completions        {"served_by": <hostname>}
    POST /v1/chat/completions   5 server-sent events, 0.4 s apart, then [DONE]
"""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Upstream(BaseHTTPRequestHandler):
    def _body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)

    def do_GET(self) -> None:
        status = 200 if self.path == "/health" else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self._body()
        if self.path == "/v1/completions":
            body = json.dumps({"served_by": socket.gethostname()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(5):
            self.wfile.write(f"data: {json.dumps({'chunk': i})}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.4)
        self.wfile.write(b"data: [DONE]\n\n")


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 8000), Upstream).serve_forever()
