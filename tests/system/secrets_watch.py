"""Watching for a secret on this machine: a thread samples `ps -eo args` and every
/proc/<pid>/cmdline and /proc/<pid>/environ every 0.05 s (test_local_default.py
runs the verify phase with -vvv under it, with a random API key).

What may hold the key in its environment (readable by its owner and root only):
- processes that held it before the verify run started: vLLM gets the key as
  VLLM_API_KEY by design (the test checks that it does);
- the controller: ansible-playbook got the key from this test in VLLM_API_KEY,
  and on a local connection every process it starts inherits its environment
  (Ansible's `sh -c` wrappers) - except the probe, which must not hold it.
Nothing may show the key on a command line, at any time.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROBE = b"verify_probe.py"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cmdline: bytes
    environ: bytes


def read_procs() -> dict[int, Proc]:
    """Every process this moment, as far as it can be read (processes come and go)."""
    procs: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        procs[int(entry.name)] = Proc(int(entry.name), int(stat.rsplit(")", 1)[1].split()[1]), cmdline, environ)
    return procs


def descends_from(pid: int, roots: set[int], procs: dict[int, Proc]) -> bool:
    seen: set[int] = set()
    while pid in procs and pid not in seen:
        if pid in roots:
            return True
        seen.add(pid)
        pid = procs[pid].ppid
    return pid in roots


@dataclass
class Watch:
    """Samples ps and /proc in a thread; records where ``key`` (the key's random part) shows
    up where it must not."""

    key: bytes
    allowed_roots: set[int]
    interval: float = 0.05
    rounds: int = 0
    probe_seen: int = 0
    findings: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, check=False).stdout
        if self.key in ps:
            self.findings.append("ps -eo args shows the key")
        procs = read_procs()
        for proc in procs.values():
            name = proc.cmdline.replace(b"\0", b" ").replace(self.key, b"<KEY>")[:200].decode(errors="replace")
            is_probe = PROBE in proc.cmdline
            self.probe_seen += is_probe
            if self.key in proc.cmdline:
                self.findings.append(f"cmdline of {proc.pid}: {name}")
            if self.key in proc.environ and (is_probe or not descends_from(proc.pid, self.allowed_roots, procs)):
                self.findings.append(f"environ of {proc.pid}: {name}")
        self.rounds += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)


def holders(key: bytes) -> dict[int, Proc]:
    return {pid: p for pid, p in read_procs().items() if key in p.environ}
