#!/usr/bin/env python3
"""verify.yml's probe: for each target, /health, /v1/models, one /v1/completions
and one streamed /v1/chat/completions (time to the first token). Stdlib only;
runs on a node that reaches every endpoint.

    echo "$KEY" | verify_probe.py TARGETS_JSON
    TARGETS_JSON: [{"endpoint": "host:port", "via": "gateway|direct", "model": NAME}, ...]

The API key is the first line of stdin (an empty line: no key). It is never in
argv or in the environment, where `ps` or /proc/<pid>/environ would show it.
Prints one JSON list, one result per target.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from typing import Any, TextIO

TIMEOUT = 120.0


def read_key(stream: TextIO) -> str:
    """The API key: the first line of ``stream`` without its line end; "" for none."""
    return stream.readline().rstrip("\r\n")


def auth_headers(key: str) -> dict[str, str]:
    # http.client would refuse a CR or LF with the header, key included, in its error.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise ValueError("the API key holds a control character")
    return {"Authorization": f"Bearer {key}"} if key else {}


def request(
    endpoint: str, method: str, path: str, body: dict[str, Any] | None = None, key: str = ""
) -> tuple[int, bytes]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    headers = {"Content-Type": "application/json", **auth_headers(key)}
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stream_chat(endpoint: str, model: str, key: str = "") -> tuple[bool, float | None, str]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "stream": True,
    }
    started = time.monotonic()
    first: float | None = None
    chunks = 0
    done = False
    try:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(key)}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return False, None, f"HTTP {resp.status}: {resp.read()[:200]!r}"
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            delta = (event.get("choices") or [{}])[0].get("delta", {})
            if first is None and (delta.get("content") or delta.get("reasoning_content")):
                first = time.monotonic() - started
            chunks += 1
    except (OSError, ValueError, http.client.HTTPException) as err:
        return False, first, f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    ok = done and chunks > 0
    return ok, first, "" if ok else f"stream ended after {chunks} chunk(s) without [DONE]"


def probe(target: dict[str, Any], key: str = "") -> dict[str, Any]:
    endpoint, model = target["endpoint"], target["model"]
    result: dict[str, Any] = {**target, "errors": []}
    try:
        status, _ = request(endpoint, "GET", "/health", key=key)
        result["health"] = status == 200
        if status != 200:
            result["errors"].append(f"/health: HTTP {status}")
        status, body = request(endpoint, "GET", "/v1/models", key=key)
        ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
        result["models"] = model in ids
        if not result["models"]:
            result["errors"].append(f"/v1/models: HTTP {status}, {model} not in {ids}")
        started = time.monotonic()
        status, body = request(
            endpoint,
            "POST",
            "/v1/completions",
            {"model": model, "prompt": "Once upon a time", "max_tokens": 16},
            key=key,
        )
        result["completion_s"] = round(time.monotonic() - started, 3)
        answer = json.loads(body) if status == 200 else {}
        result["completion"] = bool(answer.get("choices")) and answer.get("usage", {}).get("completion_tokens", 0) > 0
        if not result["completion"]:
            result["errors"].append(f"/v1/completions: HTTP {status}, {body[:200]!r}")
    except (OSError, ValueError, http.client.HTTPException) as err:
        result["errors"].append(f"{type(err).__name__}: {err}")
    ok, first, error = stream_chat(endpoint, model, key)
    result["stream"] = ok
    result["first_token_s"] = None if first is None else round(first, 4)
    if error:
        result["errors"].append(f"streamed chat: {error}")
    for name in ("health", "models", "completion"):
        result.setdefault(name, False)
    result["ok"] = all(result[k] for k in ("health", "models", "completion", "stream"))
    if key:  # no error message may quote the key (a server echoing the header, say)
        for shown in {key, repr(key)[1:-1]}:
            result["errors"] = [e.replace(shown, "<key>") for e in result["errors"]]
    return result


def main(argv: list[str] | None = None, stdin: TextIO | None = None) -> int:
    targets = json.loads((sys.argv[1:] if argv is None else argv)[0])
    key = read_key(sys.stdin if stdin is None else stdin)
    print(json.dumps([probe(t, key) for t in targets]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
