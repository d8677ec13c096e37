#!/usr/bin/env python3
"""Say whether a model fits where it is going, before the files travel.

    space.py DIR BYTES  -> prints {"dir": DIR, "free": F, "present": P, "needed": N, "fits": bool}

BYTES: the model's size (every file). ``present``: the bytes of the files already under DIR (a
re-run's copy sends only what differs). ``needed``: what the fetch still writes, BYTES - present
(at least 0). ``free``: what the filesystem that will hold DIR has for root now (DIR, or the
nearest folder above it that exists). Never fails: a path that cannot be read counts as empty.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def present_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def free_bytes(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stat = os.statvfs(probe)
    return stat.f_bfree * stat.f_frsize if os.geteuid() == 0 else stat.f_bavail * stat.f_frsize


def check(folder: Path, size: int) -> dict[str, object]:
    present = present_bytes(folder) if folder.is_dir() else 0
    needed = max(0, size - present)
    free = free_bytes(folder)
    return {"dir": str(folder), "free": free, "present": present, "needed": needed, "fits": needed <= free}


if __name__ == "__main__":
    print(json.dumps(check(Path(sys.argv[1]), int(sys.argv[2]))))
