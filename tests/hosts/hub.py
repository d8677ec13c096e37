"""A stand-in for the Hugging Face Hub, for tests: the model hub is not reachable from our machines.

It serves model folders under ROOT (ROOT/<org>/<name>/...) through the part of the Hub's HTTP API
that ``huggingface_hub.snapshot_download`` and ``hf_hub_download`` use (clients point HF_ENDPOINT
at it):

    GET  /api/models/<org>/<name>/revision/<rev>            repo info with the commit sha
    GET  /api/models/<org>/<name>/tree/<rev>[/<path>]       the file list (recursive)
    HEAD /<org>/<name>/resolve/<rev>/<file>                 X-Repo-Commit, ETag, Content-Length
    GET  /<org>/<name>/resolve/<rev>/<file>                 the bytes

Every repository is private: a request without ``Authorization: Bearer <token>`` gets 401, as a
gated model does, so a test shows whether the token reached the client. The commit sha is derived
from the files' contents, so changing a file makes a new revision. Requests are logged without
their headers (the token is never printed).

    python -m tests.hosts.hub --root DIR --address 10.77.0.1 --port 8765 --token SECRET
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def _files(repo: Path) -> list[Path]:
    return sorted(p for p in repo.rglob("*") if p.is_file() and not p.name.startswith("."))


def commit_of(repo: Path) -> str:
    digest = hashlib.sha1()
    for path in _files(repo):
        digest.update(path.relative_to(repo).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _etag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class HubHandler(BaseHTTPRequestHandler):
    root: Path
    token: str

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"[hub] {self.command} {urlsplit(self.path).path} -> {args[1] if len(args) > 1 else ''}\n")

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: object) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _repo(self, org: str, name: str) -> Path | None:
        repo = (self.root / org / name).resolve()
        return repo if repo.is_dir() and repo.is_relative_to(self.root.resolve()) else None

    def _route(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self._send(401, b'{"error": "Invalid credentials in Authorization header"}', {"X-Error-Code": "GatedRepo"})
            return
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] in ("revision", "tree"):
            repo = self._repo(parts[2], parts[3])
            if repo is None:
                self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                return
            commit = commit_of(repo)
            if parts[4] == "revision":
                files = [p.relative_to(repo).as_posix() for p in _files(repo)]
                siblings = [{"rfilename": f} for f in files]
                self._json({"id": f"{parts[2]}/{parts[3]}", "sha": commit, "siblings": siblings})
                return
            prefix = "/".join(parts[6:])
            self._json(
                [
                    {"type": "file", "path": rel, "size": p.stat().st_size, "oid": _etag(p)}
                    for p in _files(repo)
                    if (rel := p.relative_to(repo).as_posix()).startswith(prefix)
                ]
            )
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(parts[0], parts[1])
            path = (repo / "/".join(parts[4:])).resolve() if repo else None
            if repo is None or path is None or not path.is_file() or not path.is_relative_to(repo):
                self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})
                return
            headers = {"X-Repo-Commit": commit_of(repo), "ETag": f'"{_etag(path)}"'}
            self._send(200, path.read_bytes(), headers)
            return
        self._send(404, b'{"error": "not served by the stand-in hub"}')

    do_GET = _route
    do_HEAD = _route


def serve(root: Path, address: str, port: int, token: str) -> ThreadingHTTPServer:
    """Start the stand-in hub in a thread; ``server.shutdown()`` stops it."""
    handler = type("Handler", (HubHandler,), {"root": root, "token": token})
    server = ThreadingHTTPServer((address, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    server = serve(args.root, args.address, args.port, args.token)
    print(f"stand-in hub on http://{args.address}:{server.server_address[1]} serving {args.root}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
