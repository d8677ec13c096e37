"""The node's watchdog for hung vLLM launches: a process that crashed is restarted by
its supervisor (systemd's Restart=, Docker's restart policy), but one that is alive and
hung (a stuck engine, a stopped process) keeps its port and never exits. This asks each
serving launch's /health every interval; after ``failures`` failed checks in a row it
kills the launch and starts it again. A multi-node group follows its head: the group
wrapper (group) of every member sees the head go and restarts its rank with it.

A stuck engine answers /health all the same (vLLM's /health only asks whether the engine
core died; vLLM issues #11996, #39863): with ``stall_s`` set, each check of a healthy launch
also reads its /metrics, and a launch whose requests run or wait while no token has been
generated for ``stall_s`` seconds is restarted too, with the reason in the journal.

A launch is watched only once it answered after its (re)start: vLLM loads and profiles
for minutes first, which the role's start-up wait covers. A launch that is not running
(stopped by the operator or the role) is left alone.

    watchdog --config watchdog.json

watchdog.json: {"interval": S, "timeout": S, "failures": N, "stall_s": S (0: off), "status": PATH,
                "launches": [{"name": N, "url": URL, "metrics_url": URL,
                              "runtime": "systemd"|"container", "unit": UNIT}]}
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from .common import (
    Say,
    StopFlag,
    container_state,
    descendants,
    http_ok,
    http_text,
    kill_all,
    output,
    runs_agent,
    unit_props,
    write_atomic,
)

say = Say("vllm-fleet watchdog")


# vLLM's scheduler gauges and its generated-token counter (vllm/v1/metrics/loggers.py), summed
# over their labels (one sample per engine).
_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_TOKENS = "vllm:generation_tokens_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")


def progress(text: str) -> tuple[float, float] | None:
    """(requests running or waiting, tokens generated so far) from a /metrics page; None when
    the page has no token counter (not vLLM, or not yet)."""
    busy, tokens, seen = 0.0, 0.0, False
    for line in text.splitlines():
        found = _SAMPLE.match(line.strip())
        if not found or line.startswith("#"):
            continue
        name, value = found.group(1), found.group(3)
        try:
            number = float(value)
        except ValueError:
            continue
        if name in _BUSY:
            busy += number
        elif name == _TOKENS:
            tokens += number
            seen = True
    return (busy, tokens) if seen else None


def read_progress(url: str, timeout: float) -> tuple[float, float] | None:
    text = http_text(url, timeout)
    return None if text is None else progress(text)


def generation(launch: dict[str, Any]) -> str | None:
    """What identifies this start of the launch (None: not running)."""
    if launch["runtime"] == "container":
        found = container_state(launch["unit"], ".State.Running", ".State.StartedAt")
        return found[1] if len(found) == 2 and found[0] == "true" else None
    props = unit_props(launch["unit"], "ActiveState", "MainPID")
    if props.get("ActiveState") != "active" or props.get("MainPID", "0") == "0":
        return None
    return props["MainPID"]


def restart(launch: dict[str, Any]) -> None:
    if launch["runtime"] == "container":
        output(["docker", "restart", "--time", "0", launch["unit"]])
        return
    # SIGKILL reaches a stopped process too (SIGTERM would wait for SIGCONT).
    main = output(["systemctl", "show", "-p", "MainPID", "--value", launch["unit"]])
    if main.isdigit() and main != "0" and runs_agent(main, "reap"):
        # Everything below reap, not reap itself: it reaps them and exits with the launch's
        # status once none is left, so systemd sees an empty unit at once. Killing the main
        # process too would leave systemd waiting TimeoutStopSec for a cgroup-empty
        # notification that the legacy cgroup hierarchy in a container never sends.
        kill_all(descendants(int(main)))
    else:
        # Every process of the unit (vLLM's engine and workers are its children).
        output(["systemctl", "kill", "--signal=SIGKILL", launch["unit"]])
    output(["systemctl", "restart", launch["unit"]])


def stalled(launch: dict[str, Any], seen: dict[str, Any], stall_s: float, timeout: float) -> bool:
    """Whether ``launch`` (healthy) has had requests running or waiting and generated no token
    for ``stall_s`` seconds: a stuck engine. ``seen``: its token counter and since when it has
    not moved (updated here); a page that cannot be read decides nothing."""
    now = time.monotonic()
    found = read_progress(str(launch["metrics_url"]), timeout)
    if found is None:
        return False
    busy, tokens = found
    if busy <= 0 or tokens != seen["tokens"] or seen["since"] is None:
        seen.update(tokens=tokens, since=now)
        return False
    if now - float(seen["since"]) < stall_s:
        return False
    say(
        f"{launch['name']}: {busy:g} request(s) running or waiting and no token generated for "
        f"{now - float(seen['since']):.0f} s while /health answers: the engine is stuck; killing and restarting it"
    )
    seen.update(tokens=None, since=None, stalls=int(seen["stalls"]) + 1)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="watchdog", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    interval, timeout = float(config.get("interval", 2)), float(config.get("timeout", 3))
    failures = int(config.get("failures", 3))
    stall_s = float(config.get("stall_s", 0))
    status_path = Path(config["status"]) if config.get("status") else None
    launches: list[dict[str, Any]] = list(config["launches"])
    state: dict[str, dict[str, Any]] = {
        launch["name"]: {"gen": None, "watched": False, "fails": 0, "restarts": 0} for launch in launches
    }
    # Per launch: the token counter last seen, when it last moved (or nothing was asked), and
    # the restarts for a stall (in the status file beside ``state``).
    moving: dict[str, dict[str, Any]] = {n: {"tokens": None, "since": None, "stalls": 0} for n in state}
    stop = StopFlag()
    say(f"watching {len(launches)} launch(es) every {interval:g} s; {failures} failed checks in a row restart one")
    while not stop:
        started = time.monotonic()
        for launch in launches:
            st = state[launch["name"]]
            gen = generation(launch)
            if gen is None or gen != st["gen"]:
                # Not running, or started again (by the role, systemd or us): wait for its first answer.
                st.update(gen=gen, watched=False, fails=0)
                if gen is None:
                    continue
            if http_ok(launch["url"], timeout):
                if not st["watched"]:
                    say(f"{launch['name']}: answers /health; watching it")
                    moving[launch["name"]].update(tokens=None, since=None)
                st.update(watched=True, fails=0)
                if (
                    stall_s > 0
                    and launch.get("metrics_url")
                    and stalled(launch, moving[launch["name"]], stall_s, timeout)
                ):
                    restart(launch)
                    st.update(gen=generation(launch), watched=False, fails=0, restarts=st["restarts"] + 1)
                continue
            if not st["watched"]:
                continue
            st["fails"] += 1
            if st["fails"] >= failures:
                say(
                    f"{launch['name']}: /health did not answer {st['fails']} times in a row "
                    f"({timeout:g} s each) while the process runs: hung; killing and restarting it"
                )
                restart(launch)
                st.update(gen=generation(launch), watched=False, fails=0, restarts=st["restarts"] + 1)
        if status_path is not None:
            status = {"updated": time.time(), "launches": state, "progress": moving}
            write_atomic(status_path, json.dumps(status, sort_keys=True) + "\n")
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return 0
