"""What the gateway's verify step measures from node1 (prints one JSON line)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

BASE, KEY = sys.argv[1], sys.argv[2]


def call(path: str, key: str | None = KEY, body: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(BASE + path, data=json.dumps(body or {}).encode() if body is not None else None)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def stream() -> dict[str, float]:
    request = urllib.request.Request(BASE + "/v1/chat/completions", data=b'{"stream": true}')
    request.add_header("Authorization", f"Bearer {KEY}")
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=30) as response:
        for line in response:
            if line.startswith(b"data:") and first is None:
                first = time.monotonic() - start
    return {"first_chunk_s": round(first or -1, 3), "total_s": round(time.monotonic() - start, 3)}


served = [json.loads(call("/v1/completions", body={"prompt": "hi"})[1])["served_by"] for _ in range(20)]
print(
    json.dumps(
        {
            "served_by": sorted(set(served)),
            "statuses": sorted({call("/v1/completions", body={})[0] for _ in range(10)}),
            "no_key": call("/v1/completions", key=None, body={})[0],
            "wrong_key": call("/v1/completions", key="wrong", body={})[0],
            "key_in_other_case": call("/v1/completions", key=KEY.swapcase(), body={})[0],
            "key_with_a_suffix": call("/v1/completions", key=KEY + "x", body={})[0],
            "health_no_key": call("/health", key=None)[0],
            "stream": stream(),
        }
    )
)
