"""What the gateway's routing by model costs per request, on this machine: the llm_gateway
role's own nginx configuration (tests/gateway_local.py) in front of two local stand-in
replicas, one request at a time over a kept-alive connection, for a short body and a 32 KiB
one (a long prompt), each measured

* straight to a replica (the baseline),
* through the one-model gateway (proxy_pass to one upstream group),
* through the several-models gateway (njs reads the body, routes by its model).

It prints p50 and p99 per path and what each gateway adds to the baseline. vLLM's own time
is not in it (the replicas answer at once): this is the gateway's share of a request.

    python tests/bench/routing_overhead.py [--requests 2000]

Needs nginx and libnginx-mod-http-js (Debian), as the routing integration test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import gateway_local


def _latencies(port: int, body: bytes, requests: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    headers = {"Content-Type": "application/json"}
    out = []
    for i in range(requests + 50):
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        if i >= 50:  # warm-up: connections, nginx's keepalive pool
            out.append(time.perf_counter() - start)
    conn.close()
    return out


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    if gateway_local.NGINX is None or not gateway_local.NJS.exists():
        print("nginx and libnginx-mod-http-js are needed (apt-get install nginx libnginx-mod-http-js)")
        return 2
    replicas = {name: gateway_local.replica(name) for name in ("alpha", "beta")}
    models = {name: [f"127.0.0.1:{s.server_address[1]}"] for name, s in replicas.items()}
    bodies = {
        "short": json.dumps({"model": "alpha", "prompt": "Hello", "max_tokens": 4}).encode(),
        "32 KiB": json.dumps({"model": "alpha", "prompt": "x" * 32768, "max_tokens": 4}).encode(),
    }
    rows = []
    with (
        tempfile.TemporaryDirectory() as one,
        tempfile.TemporaryDirectory() as several,
        gateway_local.gateway(Path(one), {"alpha": models["alpha"]}, route_by_model=False) as plain,
        gateway_local.gateway(Path(several), models) as routed,
    ):
        for label, body in bodies.items():
            direct = _latencies(replicas["alpha"].server_address[1], body, args.requests)
            base = _p(direct, 50)
            for path, port in (("direct", None), ("gateway, one model", plain["port"]),
                               ("gateway, by model (njs)", routed["port"])):  # fmt: skip
                lat = direct if port is None else _latencies(int(port), body, args.requests)
                p50, p99 = _p(lat, 50), _p(lat, 99)
                added = "" if port is None else f"{p50 - base:+.0f}"
                rows.append((label, path, f"{p50:.0f}", f"{p99:.0f}", added))
    for server in replicas.values():
        server.shutdown()
    print(f"gateway routing overhead: {args.requests} sequential requests per row, kept-alive connection")
    header = ("body", "path", "p50 µs", "p99 µs", "added p50 µs")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
