"""The API key stays off every command line, out of -vvv output and out of the
verify probe's environment, on the live local default (this machine, as root).

The test deploys the local default with a random key (site.yml, VLLM_API_KEY),
then runs the verify phase with -vvv while a thread samples `ps -eo args` and
every /proc/<pid>/cmdline and /proc/<pid>/environ every 0.05 s. At the end it
tears the local default down (as test_local_default does).

What may hold the key in its environment (readable by its owner and root only):
- processes that held it before the verify run started: vLLM gets the key as
  VLLM_API_KEY by design (the test checks that it does);
- the controller: ansible-playbook got the key from this test in VLLM_API_KEY,
  and on a local connection every process it starts inherits its environment
  (Ansible's `sh -c` wrappers) - except the probe, which must not hold it.
Nothing may show the key on a command line, at any time.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_playbook

INVENTORY = ROOT / "inventories/local"
VLLM = Path("/opt/vllm-fleet/vllm/bin/vllm")
PROBE = b"verify_probe.py"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="deploys on this machine and reads every process's environment: root"),
    pytest.mark.skipif(not VLLM.exists(), reason=f"the local default's vLLM is not installed ({VLLM}): make run"),
]


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


def test_the_api_key_is_never_on_a_command_line_nor_in_verbose_output(tmp_path: Path) -> None:
    # Shell and nginx metacharacters on purpose: the env files and the gateway's key file must carry them.
    # The random part is what is looked for: a shell-quoted copy of the key still holds it in one piece.
    token = secrets.token_hex(12)
    key = f"vf-{token}-$a\"b'c\\d#e%f"
    env = {"VLLM_API_KEY": key}
    artifacts = f"vllm_fleet_artifacts_dir={tmp_path}"
    try:
        deployed = run_playbook("site.yml", INVENTORY, "-e", artifacts, env=env, timeout=1800)
        assert deployed.returncode == 0, deployed.stdout[-6000:] + deployed.stderr[-2000:]
        assert token not in deployed.stdout + deployed.stderr, "site.yml printed the API key"

        before = holders(token.encode())
        assert any(bytes(VLLM) in p.cmdline for p in before.values()), "vLLM does not run with this key (VLLM_API_KEY)"
        # The test process and its children: ansible-playbook holds the key (it was given it), and so
        # does every process it starts on a local connection; the probe is checked on its own.
        with Watch(token.encode(), allowed_roots=set(before) | {os.getpid()}) as watch:
            # verify.yml needs the plan: site.yml's plan plays always run, the other phases are tagged.
            verified = run_playbook("site.yml", INVENTORY, "--tags", "verify", "-vvv", "-e", artifacts, env=env)
        assert verified.returncode == 0, verified.stdout[-6000:] + verified.stderr[-2000:]
        assert "endpoint(s) verified" in verified.stdout
        output = verified.stdout + verified.stderr
        assert token not in output, [line.replace(token, "<KEY>") for line in output.splitlines() if token in line][:5]
        assert watch.rounds >= 10 and watch.probe_seen > 0, f"{watch.rounds} samples, probe seen {watch.probe_seen}x"
        assert watch.findings == [], sorted(set(watch.findings))[:20]
    finally:
        down = run_playbook("playbooks/teardown.yml", INVENTORY)
        assert down.returncode == 0, down.stdout[-3000:]
