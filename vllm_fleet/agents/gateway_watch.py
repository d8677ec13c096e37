"""Active health checks for the gateway: nginx's own checks are passive, so a replica
that is alive but hung (it accepts connections, never answers) would hold requests
until the read timeout. This watcher asks every upstream's /health each interval and
writes nginx's upstream list: a replica that failed ``fall`` checks in a row is marked
``down`` (out of rotation), one that then passed ``rise`` checks in a row is back.

A drained replica (a file named after it in the drain folder, written by the rolling
restart of the serve phase) is marked ``down`` too: nginx sends it no new request, and
the requests it already serves finish (nginx's reload is graceful).

On every change it rewrites the upstream file and sends nginx's master SIGHUP. Each
round it writes a status file (JSON: every upstream's state, since when, its failed
checks) that the rolling restart and `vllm-fleet status` read.

With vllm-router as the balancer (``routers`` in the configuration: one router per model
on loopback, behind nginx), the same decisions go to each router through its admin API
instead: every round its worker list (GET /list_workers) is made the model's replicas that
are in rotation (POST /add_worker, /remove_worker). A router that restarted comes back
empty and gets its workers within a round; one that does not answer is retried each round.

    gateway_watch --config watch.json [--once]

--once: one round of checks, write the upstream file, no reload, exit (the role runs it
before nginx starts, so that nginx never starts without its upstream list).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .common import HTTP_ERRORS, Say, StopFlag, http_ok, write_atomic

UP, EJECTED, DRAINED = "up", "ejected", "drained"


say = Say("vllm-fleet gateway watch")


def healthy(upstream: str, timeout: float) -> bool:
    return http_ok(f"http://{upstream}/health", timeout)


def router_call(address: str, method: str, path: str, timeout: float) -> str:
    """One call to a vllm-router's admin API (it listens on loopback, no key)."""
    request = urllib.request.Request(f"http://{address}{path}", method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return str(resp.read().decode())


class Watch:
    def __init__(self, config: dict[str, Any]) -> None:
        self.upstreams: list[str] = list(config["upstreams"])
        self.interval = float(config.get("interval", 1))
        self.timeout = float(config.get("timeout", 2))
        self.fall = int(config.get("fall", 2))
        self.rise = int(config.get("rise", 2))
        self.server_args = str(config.get("server_args", ""))
        self.conf = Path(config["upstream_conf"])
        # Several models: one more upstream file per model, holding that model's replicas
        # (nginx routes a request to the group of the model its body names).
        self.groups: list[tuple[Path, list[str]]] = [(self.conf, self.upstreams)] + [
            (Path(g["conf"]), [u for u in g["upstreams"] if u in self.upstreams]) for g in config.get("groups") or []
        ]
        # vllm-router as the balancer: each router's address and the replicas it routes to.
        self.routers: list[tuple[str, list[str]]] = [
            (str(r["address"]), [u for u in r["upstreams"] if u in self.upstreams]) for r in config.get("routers") or []
        ]
        # add_worker returns once the router saw the worker healthy (its startup timeout).
        self.router_timeout = float(config.get("router_timeout", 20))
        self.router_state: dict[str, dict[str, Any]] = {a: {"workers": None, "error": None} for a, _ in self.routers}
        self.drain = Path(config["drain_dir"])
        self.status = Path(config["status"])
        self.pidfile = Path(config["pidfile"])
        now = time.time()
        # Every upstream starts in rotation: the serve phase waited for it to be healthy.
        self.state: dict[str, dict[str, Any]] = {
            u: {"state": UP, "since": now, "fails": 0, "passes": 0, "healthy": None} for u in self.upstreams
        }

    def drained(self) -> set[str]:
        try:
            return {p.name for p in self.drain.iterdir()} & set(self.upstreams)
        except OSError:
            return set()

    def check(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(self.upstreams) or 1)) as pool:
            results = dict(
                zip(self.upstreams, pool.map(lambda u: healthy(u, self.timeout), self.upstreams), strict=True)
            )
        drained, now = self.drained(), time.time()
        for upstream, ok in results.items():
            st = self.state[upstream]
            st["healthy"] = ok
            st["fails"] = 0 if ok else st["fails"] + 1
            st["passes"] = st["passes"] + 1 if ok else 0
            old = st["state"]
            if upstream in drained:
                new = DRAINED
            elif old == UP and st["fails"] >= self.fall:
                new = EJECTED
            elif old == EJECTED and st["passes"] >= self.rise:
                new = UP
            elif old == DRAINED:
                # Undrained: back only once it answers (it may have just restarted).
                new = UP if ok else EJECTED
            else:
                new = old
            if new != old:
                st["state"], st["since"] = new, now
                why = {
                    EJECTED: f"{st['fails']} failed health check(s) in a row",
                    DRAINED: "drained for a restart",
                    UP: f"{st['passes']} passed health check(s) in a row",
                }[new]
                say(f"{upstream}: {old} -> {new} ({why})")

    def sync_routers(self) -> None:
        """Each router's workers: the replicas of its model that are in rotation."""
        for address, members in self.routers:
            st = self.router_state[address]
            want = {f"http://{u}" for u in members if self.state[u]["state"] == UP}
            try:
                have = set(json.loads(router_call(address, "GET", "/list_workers", self.router_timeout))["urls"])
                for verb, urls in (("add", sorted(want - have)), ("remove", sorted(have - want))):
                    for url in urls:
                        query = f"/{verb}_worker?url=" + urllib.parse.quote(url, safe="")
                        router_call(address, "POST", query, self.router_timeout)
                        say(f"router {address}: {verb} {url}")
            except (*HTTP_ERRORS, KeyError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if st["error"] != error:
                    say(f"router {address}: {error}; trying again next round")
                st.update(workers=None, error=error)
                continue
            st.update(workers=sorted(want), error=None)

    def render(self, upstreams: list[str] | None = None) -> str:
        lines = ["# Written by gateway_watch (vllm-fleet): the replicas and which are in rotation."]
        for upstream in self.upstreams if upstreams is None else upstreams:
            st = self.state[upstream]
            if st["state"] == UP:
                lines.append(f"server {upstream} {self.server_args};".replace(" ;", ";"))
            else:
                lines.append(f"server {upstream} down;  # {st['state']}")
        return "\n".join(lines) + "\n"

    def write(self, *, reload: bool) -> bool:
        same = True
        for conf, upstreams in self.groups:
            text = self.render(upstreams)
            try:
                unchanged = conf.read_text() == text
            except OSError:
                unchanged = False
            if not unchanged:
                write_atomic(conf, text)
                same = False
        if not same and reload:
            self.reload()
        status = {
            "updated": time.time(),
            "upstreams": {u: {k: v for k, v in st.items() if k != "passes"} for u, st in self.state.items()},
        }
        if self.routers:
            status["routers"] = self.router_state
        write_atomic(self.status, json.dumps(status, indent=1, sort_keys=True) + "\n")
        return not same

    def reload(self) -> None:
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError) as exc:
            say(f"cannot reload nginx ({self.pidfile}: {exc}); it picks the list up at its next start")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gateway_watch", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    watch = Watch(json.loads(args.config.read_text()))
    stop = StopFlag()
    if args.once:
        watch.check()
        # A replica that does not answer yet (it may still be loading) stays in rotation
        # here: nginx's passive checks cover it, and the service's first rounds decide.
        for st in watch.state.values():
            if st["state"] == EJECTED:
                st["state"] = UP
        changed = watch.write(reload=False)
        print("changed" if changed else "unchanged")
        return 0
    say(f"watching {len(watch.upstreams)} replica(s) every {watch.interval:g} s (fall {watch.fall}, rise {watch.rise})")
    while not stop:
        started = time.monotonic()
        watch.check()
        watch.sync_routers()
        watch.write(reload=True)
        time.sleep(max(0.0, watch.interval - (time.monotonic() - started)))
    return 0
