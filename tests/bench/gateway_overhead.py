"""Completion tokens/s through the nginx gateway vs straight to one vLLM
instance, sequential and with 4 concurrent clients, and the overhead ratio.
Needs a running deployment (e.g. `make run` for the local default).

    python tests/bench/gateway_overhead.py [--direct 127.0.0.1:8000] [--gateway 127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

MAX_TOKENS = 64


def _one(endpoint: str, model: str) -> int:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
    req = urllib.request.Request(f"http://{endpoint}/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=300) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def rate(endpoint: str, model: str, requests: int, clients: int) -> float:
    _one(endpoint, model)  # warm the connection and the engine
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(lambda _: _one(endpoint, model), range(requests)))
    return tokens / (time.monotonic() - start)


def measure(direct: str, gateway: str, model: str = "tiny-llama", requests: int = 24, rounds: int = 5) -> None:
    print(f"gateway overhead ({requests} completions of {MAX_TOKENS} tokens; median of {rounds} alternating rounds)")
    print(f"{'clients':>7}  {'direct tok/s':>12}  {'gateway tok/s':>13}  {'gateway/direct':>14}")
    for clients in (1, 4):
        d, g = [], []
        for _ in range(rounds):  # alternate, so warm-up and CPU drift hit both alike
            d.append(rate(direct, model, requests, clients))
            g.append(rate(gateway, model, requests, clients))
        dm, gm = statistics.median(d), statistics.median(g)
        print(f"{clients:>7}  {dm:>12.1f}  {gm:>13.1f}  {gm / dm:>14.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--direct", default="127.0.0.1:8000")
    parser.add_argument("--gateway", default="127.0.0.1:8080")
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args()
    measure(args.direct, args.gateway, args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
