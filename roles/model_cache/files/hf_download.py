"""Fetch a model from the Hugging Face Hub (or a mirror: HF_ENDPOINT) into a folder, once.

    hf_download.py resolve  --repo ORG/NAME --revision REV [--allow PATTERN ...] [--token-file F]
        -> {"commit": SHA, "bytes": B}  (B: the commit's files under the patterns)
    hf_download.py download --repo ORG/NAME --revision SHA --dir DIR [--allow PATTERN ...] [--token-file F]
        -> {"changed": bool, "commit": SHA, "files": N}

The token is read from a file (never from argv or the environment the controller logs) and is
never printed. A folder whose marker (.vllm-fleet-source.json) names the same repository and
commit is left alone. Errors print {"error": "..."} and exit 1, with the fix in the message.
Runs with a Python that has huggingface_hub (the role's venv).
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path
from typing import Any

MARKER = ".vllm-fleet-source.json"


def _token(path: str | None) -> str | None:
    if not path:
        return None
    text = Path(path).read_text().strip()
    return text or None


def _explain(exc: Exception, repo: str, folder: Path | None = None) -> str:
    from huggingface_hub import errors

    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return (
            f"the disk under {folder} filled up while {repo} was fetched: free space there, or set "
            "model_cache_dir to a filesystem with room (what was fetched so far waits in its .cache "
            "folder, not among the model's files, and the next run resumes it)"
        )
    if isinstance(exc, errors.GatedRepoError):
        return (
            f"{repo} is gated or private and the token was refused or missing: accept the model's licence on its "
            "Hub page with the token's account, then set HF_TOKEN in the environment or model_cache_hf_token (Vault)"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"{repo} was not found (or needs a token): check model_cache_repo_id and model_cache_hf_token"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{repo} has no revision like that: check model_cache_revision"
    return f"{type(exc).__name__}: {exc}"


def resolve(repo: str, revision: str, allow: list[str] | None, token: str | None) -> dict[str, Any]:
    """The revision's commit, and the bytes of its files under the allow patterns (the role
    checks each node's room for them with space.py before anything is fetched)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    commit = api.model_info(repo, revision=revision, token=token).sha
    files = [
        f for f in api.list_repo_tree(repo, revision=commit, recursive=True, token=token) if isinstance(f, RepoFile)
    ]
    size = sum(f.size for f in filter_repo_objects(files, allow_patterns=allow or None, key=lambda f: f.path))
    return {"commit": commit, "bytes": size}


def download(repo: str, commit: str, folder: Path, allow: list[str] | None, token: str | None) -> dict[str, Any]:
    from huggingface_hub import snapshot_download

    marker = folder / MARKER
    if marker.exists():
        recorded = json.loads(marker.read_text())
        if recorded.get("repo") == repo and recorded.get("commit") == commit:
            return {"changed": False, "commit": commit, "files": recorded.get("files", 0)}
    folder.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo, revision=commit, local_dir=folder, allow_patterns=allow or None, token=token)
    files = sum(1 for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts and p.name != MARKER)
    marker.write_text(json.dumps({"repo": repo, "commit": commit, "files": files}) + "\n")
    return {"changed": True, "commit": commit, "files": files}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["resolve", "download"])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--allow", action="append")
    parser.add_argument("--token-file")
    args = parser.parse_args()
    token = _token(args.token_file)
    try:
        if args.action == "resolve":
            result = resolve(args.repo, args.revision, args.allow, token)
        else:
            if args.dir is None:
                parser.error("download needs --dir")
            result = download(args.repo, args.revision, args.dir, args.allow, token)
    except Exception as exc:
        print(json.dumps({"error": _explain(exc, args.repo, args.dir)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
