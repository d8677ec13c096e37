#!/usr/bin/env python3
"""verify.yml's probe: for each target, /health, /v1/models, one /v1/completions
and one streamed /v1/chat/completions (time to the first token); for a direct
target also /metrics, for the KV blocks vLLM allocated; for a target with a
``load``, that many streamed requests by that many clients, shaped like the
plan's workload (throughput, TTFT, TPOT measured against the plan's prediction).
Stdlib only; runs on a node that reaches every endpoint.

    echo "$KEY" | verify_probe.py TARGETS_JSON
    TARGETS_JSON: [{"endpoint": "host:port", "via": "gateway|direct", "model": NAME}, ...]

The API key is the first line of stdin (an empty line: no key). It is never in
argv or in the environment, where `ps` or /proc/<pid>/environ would show it.
Prints one JSON list, one result per target.
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading
import time
from pathlib import Path
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


# What a streamed chat chunk's delta carries once the model produced its first token:
# text, reasoning (vLLM 0.32's DeltaMessage.reasoning; ``reasoning_content`` before
# its rename) or a tool call. A first chunk with only ``role`` is no token yet.
TOKEN_FIELDS = ("content", "reasoning", "reasoning_content", "tool_calls")
DONE = "[DONE]"


def sse_event(line: bytes) -> dict[str, Any] | str | None:
    """One line of a Server-Sent Events stream: the chunk of a ``data:`` line as a dict,
    ``DONE`` for ``data: [DONE]``, None for anything else (blank lines, comments,
    ``event:``/``id:`` fields). Invalid JSON raises ValueError."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == DONE.encode():
        return DONE
    event = json.loads(data)
    if not isinstance(event, dict):
        raise ValueError(f"a stream chunk that is not an object: {data[:80]!r}")
    return event


def carries_token(event: dict[str, Any]) -> bool:
    """Whether a chat completion chunk holds the first token: any choice whose delta has
    non-empty content, reasoning, reasoning_content or tool_calls."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and any(delta.get(k) for k in TOKEN_FIELDS):
            return True
    return False


# One sample of vLLM's info gauge (PrometheusStatLogger.log_metrics_info, "cache_config"):
# ``vllm:cache_config_info{block_size="16",...,engine="0",...,num_gpu_blocks="2048",...} 1.0``.
CACHE_INFO = "vllm:cache_config_info"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def metric_labels(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of every sample of metric ``name`` in a Prometheus text exposition."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(name + "{"):
            continue
        body = line[len(name) + 1 :]
        end = body.rfind("}")
        if end < 0:
            continue
        found.append({k: _unescape(v) for k, v in _LABEL.findall(body[:end])})
    return found


def gpu_blocks(text: str) -> dict[str, int] | None:
    """``num_gpu_blocks`` of each engine's ``vllm:cache_config_info`` sample ({engine: blocks}),
    or None when no sample has a number there (no such metric, or before the KV cache exists)."""
    out: dict[str, int] = {}
    for labels in metric_labels(text, CACHE_INFO):
        blocks = labels.get("num_gpu_blocks", "")
        if blocks.isdigit():
            out[labels.get("engine", "")] = int(blocks)
    return out or None


def read_blocks(endpoint: str, key: str = "") -> tuple[dict[str, int] | None, str]:
    """The blocks of ``endpoint``'s /metrics, and why there are none ("" when there are)."""
    try:
        status, body = request(endpoint, "GET", "/metrics", key=key)
    except (OSError, ValueError, http.client.HTTPException) as err:
        return None, f"{type(err).__name__}: {err}"
    if status != 200:
        return None, f"/metrics: HTTP {status}"
    blocks = gpu_blocks(body.decode("utf-8", "replace"))
    return blocks, "" if blocks else f"/metrics has no {CACHE_INFO} with num_gpu_blocks"


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
            event = sse_event(line)
            if event is None:
                continue
            if event == DONE:
                done = True
                break
            if first is None and isinstance(event, dict) and carries_token(event):
                first = time.monotonic() - started
            chunks += 1
    except (OSError, ValueError, http.client.HTTPException) as err:
        return False, first, f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    ok = done and chunks > 0
    return ok, first, "" if ok else f"stream ended after {chunks} chunk(s) without [DONE]"


def one_request(endpoint: str, model: str, tokens: int, output: int, seed: int, key: str = "") -> dict[str, Any]:
    """One streamed /v1/completions of a ``tokens``-token prompt (token ids, so its length is
    exact) generating ``output`` tokens (ignore_eos): its TTFT, TPOT and tokens, or its error."""
    prompt = [10 + (seed * 7919 + i * 104729) % 900 for i in range(tokens)]
    body = {"model": model, "prompt": prompt, "max_tokens": output, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}  # fmt: skip
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    started = time.monotonic()
    first: float | None = None
    chunks, used = 0, 0
    try:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(key)}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        while True:
            line = resp.readline()
            if not line:
                break
            event = sse_event(line)
            if event is None or event == DONE:
                if event == DONE:
                    break
                continue
            assert isinstance(event, dict)
            if any(c.get("text") for c in event.get("choices") or [] if isinstance(c, dict)):
                chunks += 1
                if first is None:
                    first = time.monotonic()
            usage = event.get("usage")
            if isinstance(usage, dict) and usage.get("completion_tokens"):
                used = int(usage["completion_tokens"])
    except (OSError, ValueError, AssertionError, http.client.HTTPException) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    finally:
        conn.close()
    end = time.monotonic()
    produced = used or chunks
    if first is None or produced < 1:
        return {"error": "no token came back"}
    return {"start": started, "end": end, "ttft": first - started, "tokens": produced,
            "tpot": (end - first) / (produced - 1) if produced > 1 else None}  # fmt: skip


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_load(endpoint: str, model: str, load: dict[str, Any], key: str = "") -> dict[str, Any]:
    """``load["requests"]`` requests by ``load["concurrency"]`` clients (each sends its next when
    one ends, as vllm bench serve --max-concurrency; none after ``load["budget_s"]`` seconds once
    one came back): what came back, as the plan predicts it."""
    pending = list(range(int(load["requests"])))
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    # No request starts after the budget (those started finish): verify's time stays bounded.
    deadline = time.monotonic() + float(load.get("budget_s") or 1e9)

    def client() -> None:
        while True:
            with lock:
                if not pending or (results and time.monotonic() > deadline):
                    return
                seed = pending.pop(0)
            got = one_request(endpoint, model, int(load["input_len"]), int(load["output_len"]), seed, key)
            with lock:
                results.append(got)

    threads = [threading.Thread(target=client) for _ in range(int(load["concurrency"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    good = [r for r in results if "error" not in r]
    out: dict[str, Any] = {"requests": len(results), "failed": len(results) - len(good),
                           "errors": sorted({r["error"] for r in results if "error" in r})[:3]}  # fmt: skip
    if good:
        wall = max(r["end"] for r in good) - min(r["start"] for r in good)
        tokens = sum(r["tokens"] for r in good)
        ttft = [r["ttft"] * 1000 for r in good]
        tpot = [r["tpot"] * 1000 for r in good if r["tpot"] is not None]
        out.update(
            output_token_throughput=round(tokens / wall, 2) if wall > 0 else None,
            request_throughput=round(len(good) / wall, 4) if wall > 0 else None,
            ttft_ms={"median": round(_quantile(ttft, 0.5), 2), "p90": round(_quantile(ttft, 0.9), 2)},
            tpot_ms={"median": round(_quantile(tpot, 0.5), 2), "p90": round(_quantile(tpot, 0.9), 2)} if tpot else None,
        )
    return out


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
    if target.get("via") == "direct":
        # The gateway answers for one upstream at a time: blocks come from each instance.
        # No metric is "not reported", never a failure: it leaves ``ok`` alone.
        result["gpu_blocks"], why = read_blocks(endpoint, key)
        if why:
            result["blocks_note"] = why
    if target.get("load") and result.get("completion"):
        # A bounded load shaped like the plan's workload: measured against the prediction.
        # A measurement: its failed requests are counted and warned about (verify.yml), the
        # endpoint's verdict is the checks above.
        result["load_measured"] = run_load(endpoint, model, target["load"], key)
    for name in ("health", "models", "completion"):
        result.setdefault(name, False)
    result["ok"] = all(result[k] for k in ("health", "models", "completion", "stream"))
    if key:  # no error message may quote the key (a server echoing the header, say)
        for shown in {key, repr(key)[1:-1]}:
            result["errors"] = [e.replace(shown, "<key>") for e in result["errors"]]
            if "load_measured" in result:
                load = result["load_measured"]
                load["errors"] = [e.replace(shown, "<key>") for e in load["errors"]]
            if "blocks_note" in result:
                result["blocks_note"] = result["blocks_note"].replace(shown, "<key>")
    return result


def main(argv: list[str] | None = None, stdin: TextIO | None = None) -> int:
    # The endpoints as JSON, or @FILE holding them: a deployment of hundreds of instances passes
    # Linux's limit on one argument (128 KiB; 430 KiB at 1,000 nodes).
    given = (sys.argv[1:] if argv is None else argv)[0]
    targets = json.loads(Path(given[1:]).read_text() if given.startswith("@") else given)
    key = read_key(sys.stdin if stdin is None else stdin)
    print(json.dumps([probe(t, key) for t in targets]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
