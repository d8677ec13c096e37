"""The gateway's routing by model with real nginx and its njs module, on this machine: the
llm_gateway role's own templates (nginx.conf, route.js, api_key.conf) rendered by Ansible,
the upstream files written by the gateway_watch agent (--once), and two local HTTP
servers as the replicas of two models. What the system test (test_containers_on_hosts) proves
with vLLM on the test hosts, checked here in seconds: the body reaches the named model's
replica intact, streaming passes through, an unknown model gets vLLM's 404, a body that is
not JSON or names no model gets 400, no key gets 401, and /v1/models merges both lists
(and still answers when one model's replicas are down)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests import gateway_local
from tests.conftest import PLAYBOOK

REQUIRED = os.environ.get("VLLM_FLEET_NJS_REQUIRED") == "1"
KEY = "routing-test-key"

if gateway_local.NGINX is None or not gateway_local.NJS.exists() or PLAYBOOK is None:
    if REQUIRED:
        raise RuntimeError("nginx with njs is required (apt-get install nginx libnginx-mod-http-js)")
    pytest.skip("nginx or its njs module is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    replicas = {name: gateway_local.replica(name) for name in ("alpha", "beta")}
    models = {name: [f"127.0.0.1:{s.server_address[1]}"] for name, s in replicas.items()}
    try:
        with gateway_local.gateway(tmp_path_factory.mktemp("gateway"), models, KEY) as gw:
            yield {**gw, "replicas": replicas}
    finally:
        for server in replicas.values():
            server.shutdown()


def _request(url: str, body: bytes | None, key: str | None = KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_each_request_reaches_the_replica_of_the_model_it_names(gateway: dict[str, Any]) -> None:
    for name in ("alpha", "beta"):
        body = {"model": name, "prompt": "x" * 5000, "max_tokens": 4}  # larger than nginx's default buffer
        status, raw = _request(gateway["url"] + "/v1/completions", json.dumps(body).encode())
        assert status == 200, raw
        answer = json.loads(raw)
        assert (answer["model"], answer["echo"], answer["path"]) == (name, body, "/v1/completions")


def test_a_streamed_answer_passes_through(gateway: dict[str, Any]) -> None:
    body = json.dumps({"model": "beta", "messages": [], "stream": True}).encode()
    status, raw = _request(gateway["url"] + "/v1/chat/completions", body)
    assert status == 200 and raw.count(b"data: ") == 4 and raw.endswith(b"data: [DONE]\n\n"), raw


def test_bad_requests_get_the_openai_errors(gateway: dict[str, Any]) -> None:
    url = gateway["url"] + "/v1/completions"
    status, raw = _request(url, json.dumps({"model": "gamma", "prompt": "x"}).encode())
    assert status == 404
    assert json.loads(raw) == {
        "error": {
            "message": "The model `gamma` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    status, raw = _request(url, b"not json")
    assert status == 400 and json.loads(raw)["error"]["type"] == "BadRequestError"
    status, raw = _request(url, json.dumps({"prompt": "x"}).encode())
    assert status == 400 and "served: alpha, beta" in json.loads(raw)["error"]["message"]
    assert _request(url, json.dumps({"model": "alpha"}).encode(), key=None)[0] == 401
    assert _request(gateway["url"] + "/v1/models", None, key=None)[0] == 401


def test_the_model_list_merges_every_model_and_survives_one_down(gateway: dict[str, Any]) -> None:
    status, raw = _request(gateway["url"] + "/v1/models", None)
    assert status == 200
    assert [m["id"] for m in json.loads(raw)["data"]] == ["alpha", "beta"]
    gateway["replicas"]["beta"].RequestHandlerClass.down = True
    status, raw = _request(gateway["url"] + "/v1/models", None)
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["alpha"]
    assert "/v1/models without beta (no replica answered)" in gateway["error_log"].read_text()
