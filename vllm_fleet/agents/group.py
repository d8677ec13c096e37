"""Run one rank of a multi-node vLLM instance so that the group lives and dies as one.

    group --role head   --bind ADDR:PORT  --name N --state DIR [--max-restarts K] -- ARGV...
    group --role member --head ADDR:PORT  --name N --state DIR [--max-restarts K] -- ARGV...

A lone restarted rank cannot rejoin its peers (vLLM builds the process group once),
so every rank runs under this wrapper, which holds a presence connection between
the head and each member:

* the head listens on ADDR:PORT, starts its ``vllm serve`` at once, and accepts
  one connection per member; when a member's connection drops (its rank died or
  was restarted) or its own vLLM exits, it stops its vLLM and exits 1;
* a member connects to the head first (so the head, which hosts vLLM's master
  store, is up before any other rank: vLLM's order), then starts its rank; when
  the connection drops (the head died or restarted) or its own rank exits, it
  stops its rank and exits 1.

A peer that vanishes without closing the connection (its node lost power or its
network, a kernel panic, a frozen wrapper) sends no FIN: both ends therefore send a
heartbeat byte every second, and a peer silent for ``--silence`` seconds counts as
gone (a peer that never sent one, an older wrapper, is judged on its FIN alone).
Without it the head's vLLM would answer /health while every request hung in the
pipeline's next send to the missing stage.

systemd (``Restart=always``) or supervise then starts each rank again, and the
whole group comes back together. Restarts are bounded: after ``--max-restarts``
starts within ``--window`` seconds the wrapper prints why and exits 3, which the
unit's ``RestartPreventExitStatus=3`` leaves stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from .common import Say, stop_group, write_atomic

GIVE_UP = 3
CHECK_SECONDS = 1.0
HEARTBEAT = b"."


def say(name: str, text: str) -> None:
    Say(f"vllm-fleet group {name}", stderr=True)(text)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def count_start(state: Path, name: str, window: float, now: float) -> int:
    """Record this start and return how many happened within ``window`` seconds."""
    path = state / f"{name}.group-starts"
    try:
        starts = [float(t) for t in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        starts = []
    starts = [t for t in starts if now - t < window] + [now]
    write_atomic(path, json.dumps(starts))
    return len(starts)


def start_child(argv: list[str]) -> subprocess.Popen[bytes]:
    # Its own process group: stopping the rank stops its workers too.
    return subprocess.Popen(argv, start_new_session=True)


def stop_child(child: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    if child is None or child.poll() is not None:
        return
    # SIGKILL only if the rank outlives the grace; what it leaves is reaped by its supervisor.
    stop_group(child.pid, grace, lambda: child.poll() is not None, kill_rest=False)
    child.wait()


class Presence:
    """One end of a presence connection: it sends a heartbeat each check and reads the peer's."""

    def __init__(self, sock: socket.socket, peer: str, silence: float) -> None:
        sock.setblocking(False)
        self.sock, self.peer, self.silence = sock, peer, silence
        self.heard_at = time.monotonic()
        self.heard = False

    def lost(self, now: float) -> str | None:
        """Why the peer is gone (closed, reset, or silent too long), or None while it is there."""
        try:
            self.sock.send(HEARTBEAT)
        except BlockingIOError:
            pass  # the send buffer is full: the peer reads nothing, which its silence shows
        except OSError as err:
            return f"the connection broke ({err.strerror or err})"
        try:
            while select.select([self.sock], [], [], 0)[0]:
                data = self.sock.recv(4096)
                if not data:
                    return "it closed the connection"
                self.heard_at, self.heard = now, True
        except OSError as err:
            return f"the connection broke ({err.strerror or err})"
        if self.heard and now - self.heard_at > self.silence:
            return f"nothing heard from it for {now - self.heard_at:.0f} s"
        return None

    def close(self) -> None:
        # FIN first: closed with heartbeats unread, the kernel would send the peer a reset.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
            while select.select([self.sock], [], [], 0)[0] and self.sock.recv(4096):
                pass
        self.sock.close()


def run_head(args: argparse.Namespace, child_argv: list[str]) -> int:
    host, port = _split(args.bind)
    server = socket.create_server((host, port), reuse_port=False)
    server.setblocking(False)
    child = start_child(child_argv)
    members: list[Presence] = []
    say(args.name, f"head: vLLM started (pid {child.pid}), members connect to {args.bind}")
    try:
        while True:
            code = child.poll()
            if code is not None:
                say(args.name, f"head: vLLM exited with {code}; the group restarts")
                return 1
            with contextlib.suppress(BlockingIOError):
                conn, peer = server.accept()
                members.append(Presence(conn, f"{peer[0]}:{peer[1]}", args.silence))
                say(args.name, f"head: member {peer[0]} joined ({len(members)} connected)")
            now = time.monotonic()
            for member in members:
                why = member.lost(now)
                if why is not None:
                    say(
                        args.name,
                        f"head: member {member.peer} left ({why}); stopping vLLM so the group restarts as one",
                    )
                    return 1
            time.sleep(CHECK_SECONDS)
    finally:
        server.close()
        for member in members:
            member.close()
        stop_child(child)


def run_member(args: argparse.Namespace, child_argv: list[str]) -> int:
    host, port = _split(args.head)
    say(args.name, f"member: waiting for the head at {args.head} before starting this rank")
    deadline = time.monotonic() + args.head_timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                say(args.name, f"member: the head at {args.head} did not answer in {args.head_timeout:.0f} s")
                return 1
            time.sleep(2)
    head = Presence(conn, args.head, args.silence)
    child = start_child(child_argv)
    say(args.name, f"member: head reached, rank started (pid {child.pid})")
    try:
        while True:
            code = child.poll()
            if code is not None:
                say(args.name, f"member: this rank exited with {code}; the group restarts")
                return 1
            why = head.lost(time.monotonic())
            if why is not None:
                say(args.name, f"member: the head left ({why}); stopping this rank so the group restarts as one")
                return 1
            time.sleep(CHECK_SECONDS)
    finally:
        head.close()
        stop_child(child)


def main(argv: list[str]) -> int:
    raw = list(argv)
    if "--" not in raw:
        print("usage: group --role head|member ... -- ARGV...", file=sys.stderr)
        return 2
    split = raw.index("--")
    parser = argparse.ArgumentParser(prog="group")
    parser.add_argument("--role", choices=["head", "member"], required=True)
    parser.add_argument("--bind", help="head: ADDR:PORT to listen on")
    parser.add_argument("--head", help="member: the head's ADDR:PORT")
    parser.add_argument("--name", required=True)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--max-restarts", type=int, default=5)
    parser.add_argument("--window", type=float, default=600.0)
    parser.add_argument("--head-timeout", type=float, default=900.0)
    parser.add_argument("--silence", type=float, default=15.0, help="seconds without a heartbeat: the peer is gone")
    args = parser.parse_args(raw[:split])
    child_argv = raw[split + 1 :]
    if not child_argv or (args.role == "head" and not args.bind) or (args.role == "member" and not args.head):
        parser.error("head needs --bind, member needs --head, and a command after --")
    args.state.mkdir(parents=True, exist_ok=True)
    starts = count_start(args.state, args.name, args.window, time.time())
    if args.max_restarts and starts > args.max_restarts + 1:
        say(
            args.name,
            f"{starts - 1} restarts in {args.window:.0f} s (limit {args.max_restarts}): left stopped. "
            "Read this rank's and its peers' logs, fix the cause, and run site.yml again.",
        )
        return GIVE_UP
    if starts > 1:
        say(args.name, f"start {starts} in the last {args.window:.0f} s (restart {starts - 1} of {args.max_restarts})")

    def _term(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    if args.role == "head":
        return run_head(args, child_argv)
    return run_member(args, child_argv)
