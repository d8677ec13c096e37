"""python -m tests.hosts COMMAND: the test-host harness (see tests/hosts/README.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tests.hosts import ci, engine, images, nodes
from tests.hosts.common import DEFAULT_NODES, HarnessError, ensure_machine_packages, require_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hosts", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start N test hosts (and the Docker Engine) and keep them")
    p_up.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    p_up.add_argument("--no-engine", action="store_true", help="hosts only, no Docker Engine")
    engines_help = "hosts that can run their own Docker Engine (privileged, private cgroup namespace)"
    p_up.add_argument("--engines", action="store_true", help=engines_help)
    p_reset = sub.add_parser("reset", help="replace the hosts with fresh ones")
    p_reset.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    p_reset.add_argument("--engines", action="store_true", help=engines_help)
    sub.add_parser("down", help="remove hosts, network and engine; restore the machine's network")
    sub.add_parser("status", help="list the hosts")
    p_ssh = sub.add_parser("ssh", help="ssh into a host: ssh node1 [command]")
    p_ssh.add_argument("node")
    p_ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("env", help='print export lines: eval "$(python -m tests.hosts env)"')
    sub.add_parser("images", help="build (or reuse) the rootfs, the host image and the wheel folder")
    sub.add_parser("oracle", help="build (or reuse) the venv with vLLM's CPU build the oracle tests run in")
    sub.add_parser("ray-serve", help="build (or reuse) the venv with Ray Serve that checks the Ray Serve LLM config")
    sub.add_parser("engine-up", help="start the Docker Engine only")
    sub.add_parser("engine-down", help="stop the Docker Engine only")
    sub.add_parser("serving-image", help="build (or reuse) the stand-in serving image and its docker save file")
    p_ci = sub.add_parser("ci", help="what CI runs, with a timing table")
    p_ci.add_argument("--hosts-only", action="store_true", help="skip lint and the unit/integration tests")
    p_ci.add_argument("--keep", action="store_true", help="leave hosts and engine running afterwards")
    p_ci.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    p_ci.add_argument(
        "--extended", choices=ci.EXTENDED_MODES, default="with",
        help="the extended checks (the container test, the system tests marked extended, the harness "
        "self-test): with the rest (default), without them (make test), or only them (make test-extended)",
    )  # fmt: skip
    p_ci.add_argument(
        "--only", action="append", default=[], metavar="TEXT",
        help="run only the test stages whose name contains TEXT (repeatable), e.g. --only ray_cluster --only system",
    )  # fmt: skip
    lane_help = "CI's second lane: scenarios and test files on hosts of their own (VLLM_FLEET_TEST_LANE)"
    p_lane = sub.add_parser("lane", help=lane_help)
    p_lane.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    p_lane.add_argument("--results", required=True, help="where the lane writes each item's result (JSON)")
    p_lane.add_argument(
        "scenario", nargs="+", help="PROJECT:SCENARIO (the project relative to the repository) or tests/system/*.py"
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "ci":
            return ci.main(
                with_checks=not args.hosts_only, keep=args.keep, count=args.nodes, only=args.only,
                extended=args.extended,
            )  # fmt: skip
        if args.command == "env":
            for key, value in nodes.environment().items():
                print(f"export {key}={shlex.quote(value)}")
            return 0
        if args.command == "status":
            print(nodes.status(), end="")
            print(f"Docker Engine: {'running at ' + engine.DOCKER_HOST if engine.running() else 'stopped'}")
            return 0
        if args.command == "ssh":
            nodes.ssh(args.node, args.cmd)
            return 0
        require_root()
        ensure_machine_packages()
        if args.command == "up":
            if not args.no_engine:
                engine.up()
            for node in nodes.up(args.nodes, engines=args.engines):
                print(f"{node.name}\t{node.address}")
            print(f"inventory: {nodes.INVENTORY}\nssh: python -m tests.hosts ssh node1 (or make ssh NODE=node1)")
        elif args.command == "lane":
            return ci.lane(args.scenario, args.nodes, Path(args.results))
        elif args.command == "reset":
            nodes.reset(args.nodes, engines=args.engines)
        elif args.command == "down":
            ci.teardown()
        elif args.command == "images":
            print(images.host_image())
            print(images.wheel_folder())
        elif args.command == "oracle":
            print(images.oracle_venv() / "bin" / "python")
        elif args.command == "ray-serve":
            print(images.ray_serve_venv() / "bin" / "python")
        elif args.command == "engine-up":
            print(engine.up())
        elif args.command == "engine-down":
            engine.down()
        elif args.command == "serving-image":
            print(engine.serving_image())
            print(engine.serving_tarball())
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
