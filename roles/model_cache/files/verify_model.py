#!/usr/bin/env python3
"""Check a model folder on this node: config.json parses, every safetensors file is whole
(size = 8 + header length + the end of the last tensor), the index's files are all there.

    verify_model.py DIR   -> prints {"files": N, "bytes": B, "fingerprint": F, "problems": [...]};
                             exit 1 on a problem

``fingerprint``: every file's relative path, size and modification second, hashed. Two nodes
with the same fingerprint hold the same files as rsync -a sees them (the fan-out compares each
node's with the first node's, tasks/fanout.yml).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path


def check(folder: Path) -> dict[str, object]:
    problems: list[str] = []
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"config.json: {exc}")
    for path in folder.glob("*.safetensors"):
        size = path.stat().st_size
        try:
            with path.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (OSError, ValueError, struct.error) as exc:
            problems.append(f"{path.name}: unreadable header ({exc})")
            continue
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if size != 8 + length + end:
            problems.append(f"{path.name}: {size} bytes, expected {8 + length + end} (truncated or corrupt)")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        wanted = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = [name for name in sorted(wanted) if not (folder / name).exists()]
        problems += [f"{name}: listed in the index but missing" for name in missing]
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{int(stat.st_mtime)}\n".encode())
    return {
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "fingerprint": digest.hexdigest(),
        "problems": problems,
    }


if __name__ == "__main__":
    result = check(Path(sys.argv[1]))
    print(json.dumps(result))
    sys.exit(1 if result["problems"] else 0)
