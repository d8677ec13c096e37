"""A small supervisor for hosts without systemd (containers, CI sandboxes):
what a unit with Restart=on-failure and a rotated log would do.

    supervise start  --state DIR --name N --env-file F [--log-max-bytes B] [--log-files K] -- ARGV...
    supervise stop   --state DIR --name N
    supervise status --state DIR --name N

``start`` is idempotent: when a supervisor for N already runs the same argv and
environment (sha256 of both), it does nothing; when they differ it stops the
old one first. It prints one JSON line {"changed": bool, "pid": ..., "log": ...}.
The supervisor restarts the command when it exits non-zero (backoff 2 s to
60 s), and rotates the log at --log-max-bytes keeping --log-files old ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType

from .common import alive, stop_group
from .envfile import read_env


def spec_hash(argv: list[str], env_file: str) -> str:
    env_text = Path(env_file).read_bytes() if env_file else b""
    return hashlib.sha256(json.dumps(argv).encode() + b"\0" + env_text).hexdigest()


def paths(state: str, name: str) -> dict[str, Path]:
    base = Path(state)
    return {
        "pid": base / f"{name}.pid",
        "spec": base / f"{name}.spec",
        "log": base / f"{name}.log",
        "child": base / f"{name}.child",
        "restarts": base / f"{name}.restarts",
    }


def running(p: dict[str, Path]) -> int | None:
    try:
        pid = int(p["pid"].read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def stop(p: dict[str, Path], timeout: float = 30.0) -> bool:
    pid = running(p)
    if pid is not None:
        # The supervisor and everything it started share one process group (its session's);
        # what ignored SIGTERM for ``timeout`` seconds gets SIGKILL.
        stop_group(os.getpgid(pid), timeout, lambda: not alive(pid))
        while alive(pid):
            time.sleep(0.1)
    for key in ("pid", "child"):
        p[key].unlink(missing_ok=True)
    return pid is not None


def rotate(log: Path, keep: int) -> None:
    for i in range(keep - 1, 0, -1):
        older = log.with_name(f"{log.name}.{i}")
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{i + 1}"))
    if log.exists():
        log.replace(log.with_name(f"{log.name}.1"))


def supervise(argv: list[str], env: dict[str, str], p: dict[str, Path], max_bytes: int, keep: int) -> None:
    """The supervisor's loop (runs in its own session, as the process group leader)."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    backoff = 2.0
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        p["child"].write_text(str(child.pid))
        stdout = child.stdout
        assert stdout is not None
        out = open(p["log"], "ab", buffering=0)  # noqa: SIM115 (reopened on rotation)
        written = out.tell()
        try:
            for chunk in iter(stdout.readline, b""):
                out.write(chunk)
                written += len(chunk)
                if written > max_bytes:
                    out.close()
                    rotate(p["log"], keep)
                    out = open(p["log"], "ab", buffering=0)  # noqa: SIM115
                    written = 0
        finally:
            out.close()
        code = child.wait()
        if stopping or code == 0:
            break
        with open(p["log"], "ab") as note:
            note.write(f"supervise: exited with {code}, restarting in {backoff:.0f} s\n".encode())
        count = int(p["restarts"].read_text() or 0) if p["restarts"].exists() else 0
        p["restarts"].write_text(str(count + 1))
        if time.monotonic() - started > 300:
            backoff = 2.0
        time.sleep(backoff)
        backoff = min(backoff * 2, 60.0)


def status(p: dict[str, Path]) -> dict[str, object]:
    """Whether the supervisor runs, its pid, its command's pid, the restarts since its start."""
    pid = running(p)
    child = None
    if pid is not None and p["child"].exists():
        try:
            child = int(p["child"].read_text())
        except ValueError:
            child = None
    restarts = int(p["restarts"].read_text() or 0) if p["restarts"].exists() else 0
    return {
        "changed": False,
        "running": pid is not None,
        "pid": pid,
        "child": child,
        "restarts": restarts,
        "log": str(p["log"]),
    }


def start(args: argparse.Namespace, p: dict[str, Path]) -> dict[str, object]:
    digest = spec_hash(args.argv, args.env_file)
    pid = running(p)
    if pid is not None and p["spec"].exists() and p["spec"].read_text() == digest:
        return {"changed": False, "pid": pid, "log": str(p["log"])}
    if pid is not None:
        stop(p)
    env = dict(os.environ)
    env.update(read_env(args.env_file))
    p["spec"].write_text(digest)
    os.chmod(p["spec"], 0o600)
    p["restarts"].write_text("0")
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(r)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        p["pid"].write_text(str(os.getpid()))
        os.write(w, b"1")
        os.close(w)
        try:
            supervise(args.argv, env, p, args.log_max_bytes, args.log_files)
        finally:
            p["pid"].unlink(missing_ok=True)
            p["child"].unlink(missing_ok=True)
            os._exit(0)
    os.close(w)
    os.waitpid(first, 0)
    os.read(r, 1)
    os.close(r)
    return {"changed": True, "pid": running(p), "log": str(p["log"])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervise")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--state", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--env-file", default="")
    parser.add_argument("--log-max-bytes", type=int, default=100 << 20)
    parser.add_argument("--log-files", type=int, default=5)
    raw = list(argv)
    command: list[str] = []
    if "--" in raw:
        command = raw[raw.index("--") + 1 :]
        raw = raw[: raw.index("--")]
    args = parser.parse_args(raw)
    args.argv = command
    Path(args.state).mkdir(parents=True, exist_ok=True)
    p = paths(args.state, args.name)
    if args.action == "start":
        if not args.argv:
            parser.error("start needs the command after --")
        result = start(args, p)
    elif args.action == "stop":
        result = {"changed": stop(p)}
        p["spec"].unlink(missing_ok=True)
        p["restarts"].unlink(missing_ok=True)
    else:
        result = status(p)
    print(json.dumps(result))
    return 0
