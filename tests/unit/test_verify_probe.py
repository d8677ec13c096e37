"""verify.yml's probe: the API key comes from stdin only, and reaches the server as a Bearer header."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class _OpenAIish(BaseHTTPRequestHandler):
    """Answers like vLLM, and records the Authorization header of every request."""

    seen: list[str | None]

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
        self._send(b"{}" if self.path == "/health" else json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/completions":
            self._send(json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}).encode())
        else:
            event = json.dumps({"choices": [{"delta": {"content": "hi"}}]})
            self._send(f"data: {event}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")


@pytest.fixture
def server() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_OpenAIish,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


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
    assert seen == [header] * 4  # /health, /v1/models, completion, streamed chat


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
