"""verify.yml's probe: the API key comes from stdin only, and reaches the server as a Bearer header;
the first token of a streamed chat is the first chunk with content, reasoning or a tool call; the KV
blocks come from vLLM's /metrics."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import ROOT, load_script

probe = load_script(ROOT / "playbooks/files/verify_probe.py")


@pytest.mark.parametrize(
    ("stdin", "key"),
    [
        ("s3cret\n", "s3cret"),
        ("s3cret", "s3cret"),
        ("s3cret\r\n", "s3cret"),
        ("\n", ""),
        ("", ""),
        ("first\nsecond\n", "first"),
        (' a $b "c" #d \\e \n', ' a $b "c" #d \\e '),
    ],
    ids=["one-line", "no-line-end", "crlf", "empty-line", "nothing", "only-the-first-line", "printable-kept-as-is"],
)
def test_read_key_takes_the_first_line_of_stdin(stdin: str, key: str) -> None:
    assert probe.read_key(io.StringIO(stdin)) == key


@pytest.mark.parametrize(
    ("key", "headers"),
    [("k", {"Authorization": "Bearer k"}), ("", {})],
    ids=["a-key", "no-key"],
)
def test_auth_headers(key: str, headers: dict[str, str]) -> None:
    assert probe.auth_headers(key) == headers


# A /metrics excerpt in vLLM 0.32's form: one vllm:cache_config_info sample per engine, its labels
# CacheConfig.metrics_info() (every field, as str) plus "engine". With DP the front end's one cache
# config (num_gpu_blocks already summed over the engines) is on every engine's sample.
METRICS_HEAD = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
"""
CACHE_INFO = (
    'vllm:cache_config_info{block_size="16",user_specified_block_size="False",kv_cache_layout="None",'
    'gpu_memory_utilization="0.9",cache_dtype="auto",is_attention_free="False",num_gpu_blocks_override="None",'
    'sliding_window="None",enable_prefix_caching="True",prefix_caching_hash_algo="sha256",'
    'kv_cache_dtype_skip_layers="[]",mamba_cache_mode="none",num_gpu_blocks="BLOCKS",num_cpu_blocks="None",'
    'kv_cache_size_tokens="None",kv_offloading_backend="native",_block_size_resolved="True",engine="ENGINE"} 1.0'
)


def metrics(*engines: tuple[str, str]) -> str:
    """The excerpt with one cache_config_info sample per (engine, num_gpu_blocks)."""
    samples = [CACHE_INFO.replace("BLOCKS", b).replace("ENGINE", e) for e, b in engines]
    return METRICS_HEAD + "".join(line + "\n" for line in samples)


def test_gpu_blocks_reads_every_engines_sample() -> None:
    assert probe.gpu_blocks(metrics(("0", "2048"))) == {"0": 2048}
    assert probe.gpu_blocks(metrics(("0", "4096"), ("1", "4096"))) == {"0": 4096, "1": 4096}


@pytest.mark.parametrize(
    "text",
    [
        "",
        '# only comments\nvllm:num_requests_running{engine="0"} 0.0\n',
        metrics(("0", "None")),  # before the KV cache exists
        'vllm:cache_config_info_total{num_gpu_blocks="9"} 1.0\n',  # another metric's name
    ],
    ids=["empty", "no-cache-info", "blocks-unset", "a-longer-name"],
)
def test_gpu_blocks_is_none_without_a_number(text: str) -> None:
    assert probe.gpu_blocks(text) is None


def test_metric_labels_unescape_quotes_and_keep_braces() -> None:
    line = 'vllm:cache_config_info{a="x\\"}y",b="1,2",c="back\\\\slash",num_gpu_blocks="7"} 1.0'
    assert probe.metric_labels(line, "vllm:cache_config_info") == [
        {"a": 'x"}y', "b": "1,2", "c": "back\\slash", "num_gpu_blocks": "7"}
    ]


# Chunks as vLLM 0.32's chat serving streams them (DeltaMessage: role, content, reasoning,
# tool_calls; empty tool_calls left out); reasoning_content is the field's name before 0.32.
ROLE = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",\
"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
REASONING = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",\
"choices":[{"index":0,"delta":{"reasoning":"Okay"},"logprobs":null,"finish_reason":null}]}'
REASONING_OLD = b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]}'
CONTENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}'
TOOL = b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_1","type":"function",\
"index":0,"function":{"name":"get_weather","arguments":""}}]}}]}'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}'


@pytest.mark.parametrize(
    ("line", "token"),
    [(ROLE, False), (REASONING, True), (REASONING_OLD, True), (CONTENT, True), (TOOL, True), (USAGE, False),
     (FINISH, False)],
    ids=["role-only", "reasoning", "reasoning-content", "content", "tool-call", "usage", "finish"],
)  # fmt: skip
def test_carries_token(line: bytes, token: bool) -> None:
    event = probe.sse_event(line + b"\r\n")
    assert isinstance(event, dict) and probe.carries_token(event) is token


@pytest.mark.parametrize(
    ("line", "event"),
    [(b"data: [DONE]\n", "[DONE]"), (b"\n", None), (b": keep-alive\n", None), (b"event: message\n", None),
     (b'data:{"choices":[]}\n', {"choices": []})],
    ids=["done", "blank", "comment", "event-field", "no-space"],
)  # fmt: skip
def test_sse_event(line: bytes, event: object) -> None:
    assert probe.sse_event(line) == event


@pytest.mark.parametrize("line", [b"data: {not json", b"data: [1, 2]"], ids=["broken", "not-an-object"])
def test_sse_event_refuses_what_is_no_chunk(line: bytes) -> None:
    with pytest.raises(ValueError):
        probe.sse_event(line)


class _OpenAIish(BaseHTTPRequestHandler):
    """Answers like vLLM, and records the Authorization header of every request."""

    seen: list[str | None]
    stream: ClassVar[list[bytes]] = [CONTENT]
    metrics_text: str | None = None

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.path == "/metrics":
            if self.metrics_text is None:
                self.send_error(404)
                return
            self._send(self.metrics_text.encode(), "text/plain; version=0.0.4")
            return
        self._send(b"{}" if self.path == "/health" else json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/completions":
            self._send(json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}).encode())
        else:
            self._send(b"".join(line + b"\n\n" for line in [*self.stream, b"data: [DONE]"]), "text/event-stream")


def _serve(**attrs: Any) -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_OpenAIish,), {"seen": seen, **attrs})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def server() -> Iterator[tuple[str, list[str | None]]]:
    yield from _serve(metrics_text=metrics(("0", "2048")))


@pytest.mark.parametrize(
    ("stream", "timed"),
    [([ROLE, REASONING, CONTENT], True), ([ROLE, TOOL], True), ([ROLE, FINISH, USAGE], False)],
    ids=["reasoning-model", "tool-call", "no-token"],
)
def test_stream_chat_times_the_first_token_of_any_kind(stream: list[bytes], timed: bool) -> None:
    for endpoint, _ in _serve(stream=stream):
        ok, first, error = probe.stream_chat(endpoint, "m")
        assert (ok, error) == (True, "")
        assert (first is not None) is timed


def test_direct_targets_read_blocks_and_a_missing_metric_is_no_failure() -> None:
    for endpoint, seen in _serve(metrics_text=metrics(("0", "1000"), ("1", "1000"))):
        result = probe.probe({"endpoint": endpoint, "via": "direct", "model": "m"})
        assert result["gpu_blocks"] == {"0": 1000, "1": 1000} and "blocks_note" not in result
        gateway = probe.probe({"endpoint": endpoint, "via": "gateway", "model": "m"})
        assert "gpu_blocks" not in gateway and len(seen) == 5 + 4  # the gateway: no /metrics
    for endpoint, _ in _serve():  # /metrics answers 404
        result = probe.probe({"endpoint": endpoint, "via": "direct", "model": "m"})
        assert result["ok"] is True and result["errors"] == []
        assert result["gpu_blocks"] is None and result["blocks_note"] == "/metrics: HTTP 404"


@pytest.mark.parametrize(
    ("stdin", "header"),
    [('k$1 "x"\n', 'Bearer k$1 "x"'), ("\n", None)],
    ids=["key-from-stdin", "no-key"],
)
def test_main_sends_the_key_from_stdin_not_from_the_environment(
    server: tuple[str, list[str | None]],
    stdin: str,
    header: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint, seen = server
    # The probe's old way in: an environment variable. It must be ignored now.
    monkeypatch.setenv("VLLM_FLEET_API_KEY", "from-the-environment")
    monkeypatch.setenv("VLLM_API_KEY", "from-the-environment")
    targets = [{"endpoint": endpoint, "via": "direct", "model": "m"}]
    assert probe.main([json.dumps(targets)], io.StringIO(stdin)) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["ok"] is True, result
    assert seen == [header] * 5  # /health, /v1/models, completion, streamed chat, /metrics
    assert result["gpu_blocks"] == {"0": 2048}


def test_a_key_with_a_control_character_is_not_sent_nor_printed(capsys: pytest.CaptureFixture[str]) -> None:
    # http.client refuses a header value with a bare CR and quotes the value in its error.
    targets = [{"endpoint": "127.0.0.1:9", "via": "direct", "model": "m"}]
    assert probe.main([json.dumps(targets)], io.StringIO("Sekr\rEt\n")) == 0
    out = capsys.readouterr().out
    [result] = json.loads(out)
    assert result["ok"] is False
    assert result["errors"][0] == "ValueError: the API key holds a control character", result["errors"]
    assert "Sekr" not in out


def test_auth_headers_refuse_control_characters() -> None:
    with pytest.raises(ValueError, match=r"^the API key holds a control character$"):
        probe.auth_headers("a\x01b")


class _Streaming(_OpenAIish):
    """/v1/completions with stream: one chunk a token (a few ms apart), then the usage chunk; it
    records each prompt's length."""

    prompts: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/completions":
            self._send(b"".join(line + b"\n\n" for line in [*self.stream, b"data: [DONE]"]), "text/event-stream")
            return
        if not body.get("stream"):
            self._send(json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}).encode())
            return
        self.prompts.append(len(body["prompt"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["max_tokens"]):
            time.sleep(0.002)
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")


def test_the_load_sends_its_requests_by_its_clients_and_measures_them() -> None:
    for endpoint, _ in _serve_streaming():
        load = {"requests": 6, "concurrency": 2, "input_len": 40, "output_len": 8}
        result = probe.probe({"endpoint": endpoint, "via": "gateway", "model": "m", "load": load})
        measured = result["load_measured"]
        assert result["ok"] and measured["requests"] == 6 and measured["failed"] == 0
        assert _Streaming.prompts == [40] * 6  # exact lengths: token ids
        assert measured["tpot_ms"]["median"] >= 2.0 and measured["ttft_ms"]["median"] > 0
        # 6 x 8 tokens over the run's wall time, by two clients: at most 2 x 1 token per 2 ms.
        assert 0 < measured["output_token_throughput"] <= 1000


def _serve_streaming() -> Iterator[tuple[str, list[str | None]]]:
    _Streaming.prompts = []
    seen: list[str | None] = []
    handler = type("Handler", (_Streaming,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_the_load_starts_no_request_after_its_budget() -> None:
    for endpoint, _ in _serve_streaming():
        load = {"requests": 50, "concurrency": 1, "input_len": 8, "output_len": 40, "budget_s": 0.05}
        measured = probe.run_load(endpoint, "m", load)
        # 40 tokens 2 ms apart: the first request alone outlasts the budget, and no other starts.
        assert measured["requests"] == 1 and measured["failed"] == 0


def test_the_endpoints_can_come_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify.yml passes @FILE: 1,000 nodes' endpoints (430 KiB) pass Linux's 128 KiB per argument."""
    targets = [{"endpoint": "127.0.0.1:9", "via": "direct", "model": f"m{i}"} for i in range(3)]
    listed = tmp_path / "targets.json"
    listed.write_text(json.dumps(targets))
    assert probe.main([f"@{listed}"], io.StringIO("\n")) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 3 and all(r["ok"] is False for r in results)
