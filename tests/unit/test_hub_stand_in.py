"""The stand-in Hub (tests/hosts/hub.py) answers the Hub API calls huggingface_hub makes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import requests

from tests.hosts.hub import commit_of, serve


def test_the_stand_in_hub_serves_a_private_repository(tmp_path: Path) -> None:
    repo = tmp_path / "acme" / "tiny"
    (repo / "sub").mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "llama"}')
    (repo / "sub" / "w.bin").write_bytes(b"\0" * 100)
    (tmp_path / "secret.txt").write_text("outside every repository")
    server = serve(tmp_path, "127.0.0.1", 0, "tok")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    auth = {"Authorization": "Bearer tok"}
    try:
        assert requests.get(f"{base}/api/models/acme/tiny/revision/main", timeout=5).status_code == 401
        info = requests.get(f"{base}/api/models/acme/tiny/revision/main", headers=auth, timeout=5).json()
        assert info["sha"] == commit_of(repo) and len(info["sha"]) == 40
        assert sorted(s["rfilename"] for s in info["siblings"]) == ["config.json", "sub/w.bin"]
        tree = requests.get(f"{base}/api/models/acme/tiny/tree/{info['sha']}", headers=auth, timeout=5).json()
        assert {t["path"]: t["size"] for t in tree} == {"config.json": 23, "sub/w.bin": 100}

        url = f"{base}/acme/tiny/resolve/{info['sha']}/sub/w.bin"
        head = requests.head(url, headers=auth, timeout=5)
        assert head.headers["X-Repo-Commit"] == info["sha"] and head.headers["Content-Length"] == "100"
        zeros = hashlib.sha256(b"\0" * 100).hexdigest()
        assert head.headers["ETag"] == f'"{zeros}"'
        assert requests.get(url, headers=auth, timeout=5).content == b"\0" * 100
        escape = f"{base}/acme/tiny/resolve/{info['sha']}/..%2F..%2Fsecret.txt"
        assert requests.get(escape, headers=auth, timeout=5).status_code == 404
        assert requests.get(f"{base}/api/models/acme/none/revision/main", headers=auth, timeout=5).status_code == 404

        (repo / "config.json").write_text('{"model_type": "mistral"}')
        assert commit_of(repo) != info["sha"]
    finally:
        server.shutdown()
