"""``vllm-fleet``: estimate one instance's memory, plan a cluster (and preview a change), or check its nodes (doctor).

Exit codes: 0 success; 2 bad input, or a request vLLM itself refuses (one line on stderr
naming the field and the fix); 3 the request does not fit (estimate: the table says why;
plan: no layout fits, one line with what would); doctor: 1 when a check fails; status: 1 when
an instance is unhealthy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet import __version__, schema, tools
from vllm_fleet.accounting.base import CURRENT_VLLM
from vllm_fleet.accounting.kv import chunked_local_attn_hybrid_kv
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.refusal import vllm_refusal
from vllm_fleet.accounting.settings import MAX_GPU_MEMORY_GIB, Device, Settings
from vllm_fleet.accounting.unified import estimate_cudagraphs
from vllm_fleet.deploy import deployment, records
from vllm_fleet.deploy.rayserve import serve_config
from vllm_fleet.errors import DoesNotFitError, PlanError, for_cli
from vllm_fleet.inventory import interface
from vllm_fleet.kube.options import FLAGS as KUBE_FLAGS
from vllm_fleet.model.catalog import GPUS, MODELS, lookup_gpu
from vllm_fleet.model.length import check_max_model_len
from vllm_fleet.model.quantization import ALLOW_DEPRECATED, check_quantization_flag
from vllm_fleet.model.spec import load_model
from vllm_fleet.ops import preview
from vllm_fleet.ops.calibrate import calibration, read_rows
from vllm_fleet.ops.doctor import BundleError, evaluate, exit_code, render, to_json
from vllm_fleet.performance.predict import Placement, predict
from vllm_fleet.performance.workload import add_flags as workload_flags
from vllm_fleet.performance.workload import from_args as workload_args
from vllm_fleet.performance.workload import workload_from
from vllm_fleet.planning.allocate import allocate, combined_plan, load_wishes, render_allocation
from vllm_fleet.planning.checks import check_block_size, check_release
from vllm_fleet.planning.strategy import Wishes, load_cluster, plan_cluster
from vllm_fleet.planning.table import render_estimate, render_performance, render_plan


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    if value > MAX_GPU_MEMORY_GIB:
        raise argparse.ArgumentTypeError(f"{text} is above {MAX_GPU_MEMORY_GIB:g} GiB, the largest the planner accepts")
    return value


def _count(maximum: int) -> Callable[[str], int]:
    """An argparse type: a positive integer up to ``maximum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from exc
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text} is above {maximum:,}, the largest the planner accepts")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from exc
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}; use e.g. 0.9")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE; use e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return name, value


class _Parser(argparse.ArgumentParser):
    """argparse that prints one line (field + fix) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--model", required=True, help="model folder with config.json, or a catalog name")
    p.add_argument(
        "--env",
        action="append",
        type=_env_pair,
        default=[],
        metavar="NAME=VALUE",
        help="environment vLLM runs with (as vllm_fleet_extra_env), e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; repeat",
    )
    p.add_argument(
        "--allow-deprecated-quantization",
        action="store_true",
        help="as vllm serve's: vLLM refuses fbgemm_fp8 and fp_quant without it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _declared_flags(p, command)
    workload_flags(p, command)


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from exc
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` (0) to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from exc
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high:,}, got {text}")
        return value

    return parse


def _flag_kwargs(d: schema.Declared) -> dict[str, Any]:
    """argparse's keywords for one declared option (vllm_fleet/schema.py): its type, bounds or
    choices; None when the flag is not given (the planner's default then applies)."""
    how = d.option
    out: dict[str, Any] = {"dest": d.name, "default": None, "help": how.help}
    if how.metavar:
        out["metavar"] = how.metavar
    if d.kind == "bool":
        out["action"] = argparse.BooleanOptionalAction if d.optional else "store_true"
    elif how.json_key or d.kind == "json":
        out["type"] = str  # parsed by _given, which names the flag on a bad value
    elif how.choices:
        out["type"] = type(how.choices[0])
        out["choices"] = list(how.choices)
    elif d.kind == "int":
        out["type"] = (
            _count(int(how.maximum or 1 << 30)) if how.minimum == 1 else _bounded_int(0, int(how.maximum or 0))
        )
    elif d.kind == "float":
        out["type"] = _fraction if how.maximum == 1.0 else _nonnegative_float
    return out


def _declared_flags(p: argparse.ArgumentParser, command: str) -> None:
    """Every declared option of ``command`` (vllm_fleet/schema.py) as a flag."""
    for d in schema.declared():
        if d.cli and command in d.option.commands:
            p.add_argument(d.cli, *d.option.short, **_flag_kwargs(d))


def _json_value(d: schema.Declared, text: str) -> Any:
    """A JSON option's value (``json_key``: that key of the object; None when it has none)."""
    example = "e.g. '" + json.dumps({d.option.json_key: 1} if d.option.json_key else {"method": "ngram"}) + "'"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise PlanError(str(d.cli), f"{text!r} is not JSON ({exc})", example) from exc
    if not isinstance(value, dict):
        raise PlanError(str(d.cli), f"{text!r} is not a JSON object", example)
    return value.get(d.option.json_key) if d.option.json_key else value


def _given(args: argparse.Namespace, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The declared options the command line gives (``names``: only these)."""
    out: dict[str, Any] = {}
    for d in schema.declared():
        value = getattr(args, d.name, None)
        if value is None or (names is not None and d.name not in names):
            continue
        value = _json_value(d, value) if d.kind == "json" or d.option.json_key else value
        if value is not None:
            out[d.name] = value
    return out


# estimate and plan: the request is valid but does not fit these GPUs.
EXIT_DOES_NOT_FIT = 3


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-fleet", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="per-GPU memory of one vLLM instance")
    _common(est, "estimate")
    gpu = est.add_mutually_exclusive_group(required=True)
    gpu.add_argument("--gpu-memory-gib", type=_positive_float, help="total memory the driver reports per GPU, GiB")
    gpu.add_argument("--gpu", help=f"GPU name from the catalog ({', '.join(g.name for g in GPUS.values())})")
    # What-ifs of one instance (the planner decides these for a plan).
    est.add_argument("--enable-expert-parallel", action="store_true")
    est.add_argument(
        "--nvlink",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="GPUs linked by NVLink (default: the catalog's for --gpu, else yes); off: no custom all-reduce for TP > 2",
    )
    est.add_argument("--layer-partition", default=None, help="VLLM_PP_LAYER_PARTITION, e.g. 40,40")
    est.add_argument("--engine", choices=["v0", "v1"], default=None, help="override the engine the version implies")
    est.add_argument(
        "--kv-cache-memory-bytes",
        type=_count(1 << 50),
        default=None,
        help="as vllm serve's: the KV pool's size (vLLM then skips profiling-based sizing)",
    )

    plan = sub.add_parser("plan", help="choose the layout of a model on a cluster")
    _common(plan, "plan")
    plan.add_argument("--cluster", required=True, type=Path, help="YAML file with nodes: [{name, gpu, gpu_count}]")
    plan.add_argument(
        "--models",
        type=Path,
        default=None,
        metavar="MODELS.yml",
        help="several models on the cluster: a YAML file with vllm_fleet_models: [{model, min_replicas, "
        "replicas, target_concurrency, priority, max_model_len, gpu_memory_share, ...}] (instead of --model)",
    )
    plan.add_argument(
        "--ray-serve-config",
        type=Path,
        default=None,
        metavar="FILE.yaml",
        help="with --models: also write a Ray Serve LLM application config (one LLMConfig per model) "
        "that `serve deploy` accepts on a GPU cluster",
    )
    plan.add_argument(
        "--strategy",
        action="append",
        default=None,
        choices=["replicas", "tp", "pp", "dp_ep", "instances"],
        help="allowed strategies (repeat); default all",
    )
    plan.add_argument("--ray-available", action="store_true", help="the serving image or venv has Ray")
    what = plan.add_mutually_exclusive_group()
    what.add_argument("--node", help="print this node's deployment record (JSON) instead of the plan")
    what.add_argument(
        "--diff",
        type=Path,
        metavar="APPLIED.json",
        help="preview what applying this plan starts, restarts or stops, against what the nodes run "
        "(artifacts/preview.json of `ansible-playbook site.yml --tags preview`); the deployment's "
        "settings are kept, the options given here change them",
    )
    plan.add_argument(
        "--runtime",
        choices=["container", "systemd"],
        default=None,
        help="the nodes' runtime, for --node and --diff (default: container, or the deployment's for --diff)",
    )

    for action in plan._actions:
        if action.dest == "model":
            action.required = False  # --models instead: checked in run_plan
    cal = sub.add_parser(
        "calibrate", help="this cluster's own speed from a verify run, as vllm_fleet_calibration for the next plan"
    )
    cal.add_argument("verify", type=Path, help="artifacts/verify.json of a site.yml run")
    cal.add_argument("--json", action="store_true", help="one JSON object")
    sub.add_parser("models", help="list the built-in model catalog")
    sub.add_parser("gpus", help="list the built-in GPU catalog")

    doc = sub.add_parser(
        "doctor",
        help="check the nodes for the known failure modes before serving (exit 0 pass, 1 fail, 2 usage)",
        description="Gathers a bundle from every node with playbooks/doctor.yml (-i) or reads a saved one (--bundle), "
        "then prints one line per check.",
    )
    source = doc.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-i", "--inventory", help="inventory to gather from (runs ansible-playbook playbooks/doctor.yml)"
    )
    source.add_argument("--bundle", type=Path, help="a bundle saved by playbooks/doctor.yml")
    doc.add_argument("--json", action="store_true", help="the checks as JSON")

    st = sub.add_parser(
        "status",
        help="health and load of every vLLM instance of the plan, from their /metrics (exit 0 all healthy, 1 not)",
        description="Reads the plan of the last run (<artifacts>/plan.json), then each instance's /health and "
        "/metrics; rates come from two scrapes. VLLM_API_KEY, if set, is sent (vLLM does not need it there).",
    )
    st.add_argument(
        "-i",
        "--inventory",
        help="the inventory of the run: its vllm_fleet_artifacts_dir (default artifacts/), and the way to the nodes "
        "that say why an instance is unhealthy",
    )
    st.add_argument("--plan", type=Path, help="a plan.json to read instead (with -i too: the nodes are still asked)")
    st.add_argument(
        "--watch",
        type=_watch_seconds,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    st.add_argument("--json", action="store_true", help="one JSON object (with --watch: one JSON line per refresh)")

    kube = sub.add_parser(
        "kubernetes",
        help="render the plan as Kubernetes manifests (LeaderWorkerSet, Deployments, gateway, monitoring)",
        description="Writes one YAML stream for `kubectl apply -f`: a LeaderWorkerSet per multi-node instance, a "
        "Deployment per group of alike single-node ones, a Service per model, a NetworkPolicy, the gateway, "
        "ServiceMonitors and a PrometheusRule. Secrets are named, never read.",
    )
    source = kube.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-i", "--inventory", help="plan this inventory (its plan play, --tags plan: no host is reached)"
    )
    source.add_argument("--plan", type=Path, help="a plan.json (artifacts/plan.json, or `vllm-fleet plan --json`)")
    kube.add_argument("-o", "--output", type=Path, default=None, help="write the manifests here (default stdout)")
    for f in KUBE_FLAGS:
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            kube.add_argument(flag, action="store_true", default=None, help=f.metadata["help"])
        elif f.name == "gpu_product":
            kube.add_argument(flag, action="append", default=None, metavar="GPU=LABEL", help=f.metadata["help"])
        elif f.type in ("float", float):
            kube.add_argument(flag, type=_positive_float, default=None, help=f.metadata["help"])
        else:
            kube.add_argument(flag, default=None, help=f.metadata["help"])
    return parser


def _watch_seconds(text: str) -> float:
    value = _nonnegative_float(text)
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"must be 0.1 to 86400 seconds, got {text}")
    return value


def _device_from_args(args: argparse.Namespace) -> Device:
    if args.gpu:
        gpu = lookup_gpu(args.gpu)
        if gpu is None:
            raise PlanError(
                "--gpu", f"unknown GPU '{args.gpu}'", "use --gpu-memory-gib, or a name from 'vllm-fleet gpus'"
            )
        if gpu.device == "cpu":
            raise PlanError("--gpu", "CPU needs its memory size", "use --gpu-memory-gib for the CPU KV space")
        return Device(
            gpu.name,
            gpu.memory_gib,
            gpu.device,
            gpu.capability // 10,
            None,
            gpu.capability,
            gpu.unified_memory,
            gpu.p2p,
        )
    return Device(f"{args.gpu_memory_gib:g} GiB GPU", float(args.gpu_memory_gib))


def _partition(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError as exc:
        raise PlanError(
            "--layer-partition", f"'{text}' is not a comma-separated list of integers", "e.g. 40,40"
        ) from exc


def _extra_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The vllm serve opt-ins the command line passes on (what vLLM's checks read)."""
    return (ALLOW_DEPRECATED,) if args.allow_deprecated_quantization else ()


def run_estimate(args: argparse.Namespace) -> int:
    spec = load_model(args.model)
    device = _device_from_args(args)
    settings = Settings(
        **_given(args, schema.serving_names()),
        enable_expert_parallel=args.enable_expert_parallel,
        layer_partition=_partition(args.layer_partition),
        engine=args.engine,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        chunked_local_attn_hybrid_kv=chunked_local_attn_hybrid_kv(dict(args.env)),
        estimate_cudagraphs=estimate_cudagraphs(dict(args.env)),
    )
    # What vLLM itself refuses at start-up (the planner's shorthands such as w4a16 stay
    # allowed here: an estimate may describe a checkpoint by its bytes).
    check_quantization_flag(
        spec, settings.quantization, rendered=False, vllm_version=settings.vllm_version, extra_args=_extra_args(args)
    )
    refusal = vllm_refusal(
        spec, device, settings.dtype, settings.quantization, settings.kv_cache_dtype, settings.vllm_version
    )
    if refusal is not None:
        raise refusal
    if settings.max_model_len:
        check_max_model_len(spec, settings.max_model_len, dict(args.env))
    newer = check_release(settings.vllm_version)
    check_block_size(spec, {device.kind}, settings.block_size, settings.vllm_version)
    nvlink = args.nvlink
    if nvlink is None:
        gpu = lookup_gpu(args.gpu) if args.gpu else None
        nvlink = gpu.nvlink if gpu is not None else True
    est = estimate(spec, device, settings, nvlink=nvlink)
    asked, _ = workload_args(args)
    # The whole instance's service under the workload (offline without a load flag).
    perf = predict(spec, est, device, workload_from(asked, "--input-len"), Placement(nvlink=nvlink))
    if args.json:
        print(json.dumps({**est.to_dict(), "performance": perf.to_dict(), "warnings": [newer] if newer else []},
                         indent=2))  # fmt: skip
    else:
        print(render_estimate(est) + "\n" + render_performance(perf))
        if newer:
            print(f"warning: {newer}")
    # A request that does not fit is no success: scripts tell it from one by the exit code.
    return 0 if est.fits else EXIT_DOES_NOT_FIT


def _wishes(args: argparse.Namespace) -> dict[str, Any]:
    asked, slo = workload_args(args)
    given = _given(args)
    if asked:
        given["workload"] = asked
    if slo:
        given["slo"] = slo
    return dict(
        **given,
        strategies=tuple(args.strategy) if args.strategy else None,
        model_ref=args.model,
        ray_available=args.ray_available,
        extra_env=dict(args.env),
        extra_args=_extra_args(args),
    )


def _with_extra_args(result: dict[str, Any], extra_args: list[str]) -> None:
    """The plan's vllm serve gets the opt-ins it was planned with."""
    for inst in result["instances"]:
        inst["vllm_args"] += [a for a in extra_args if a not in inst["vllm_args"]]


def _read_applied(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise PlanError("--diff", f"cannot read {path}: {exc.strerror}", "pass artifacts/preview.json") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError("--diff", f"{path} is not JSON ({exc})", "pass artifacts/preview.json") from exc
    if not isinstance(raw, dict):
        raise PlanError("--diff", f"{path} is not a JSON object", "pass artifacts/preview.json")
    return raw


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def run_diff(args: argparse.Namespace, spec: Any, cluster: Any, wishes: dict[str, Any]) -> int:
    """``plan --diff``: plan with the deployment's settings (saved in preview.json) changed by
    the options given, and compare each node's new record with what the nodes run."""

    raw = _read_applied(args.diff)
    applied = preview.applied_state(raw)
    inputs = _mapping(raw.get("inputs"))
    saved = _mapping(inputs.get("wishes"))
    fields = set(Wishes.__dataclass_fields__)
    unknown = sorted(set(saved) - fields)
    if unknown:
        raise PlanError(
            "--diff", f"inputs.wishes has unknown wish(es) {unknown}", "write it with a matching vllm-fleet"
        )
    given = {k: v for k, v in wishes.items() if v not in (None, False, "auto", {}, []) and k != "model_ref"}
    merged = {**saved, **given}
    if isinstance(merged.get("strategies"), list):
        merged["strategies"] = tuple(merged["strategies"])
    merged.setdefault("vllm_version", CURRENT_VLLM)
    result = plan_cluster(spec, cluster, Wishes(**merged))
    _with_extra_args(result, list(merged.get("extra_args") or []))
    saved_nodes = _mapping(inputs.get("nodes"))
    by_node: dict[str, dict[str, Any]] = {}
    parts: dict[str, dict[str, Any]] = {}
    try:
        for node in [n["name"] for n in result["nodes"]]:
            mine = _mapping(saved_nodes.get(node))
            settings = dict(mine.get("settings") or interface.resolve({"vllm_fleet_model": args.model}))
            if args.runtime:
                settings["runtime"] = args.runtime
            if args.vllm_version:
                settings["vllm_version"] = args.vllm_version
            record = records.node_record(result, node, settings, dict(mine.get("context") or {}))
            image = mine.get("image") if mine.get("image_base") == record["vllm"]["image"] else None
            by_node[node] = record
            parts[node] = preview.node_state(record, server_env=mine.get("server_env") or {}, image=image)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, PlanError):
            raise
        raise PlanError(
            "--diff", f"malformed inputs ({type(exc).__name__}: {exc})", "write it with playbooks/preview.yml"
        ) from exc
    first = _mapping(saved_nodes.get(next(iter(by_node), "")))
    shared = dict(first.get("settings") or interface.resolve({"vllm_fleet_model": args.model}))
    gateway = deployment.gateway_of(result, shared) if by_node else None
    found = preview.diff(applied, preview.planned_state(parts, by_node, gateway))
    print(json.dumps(found.to_dict(), indent=2) if args.json else preview.render(found))
    return 0


def run_allocate(args: argparse.Namespace) -> int:
    """``plan --models``: several models on one cluster (vllm_fleet/planning/allocate.py)."""

    cluster = load_cluster(args.cluster)
    result = allocate(load_wishes(args.models), cluster)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_allocation(result))
    if args.ray_serve_config is not None:
        config, notes = serve_config(combined_plan(result))
        header = "# Ray Serve LLM application for `serve deploy` (written by vllm-fleet plan --models)\n"
        args.ray_serve_config.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        for note in notes:
            print(f"ray serve config: {note}", file=sys.stderr)
        print(f"ray serve config: {args.ray_serve_config}", file=sys.stderr)
    return 0


def run_plan(args: argparse.Namespace) -> int:

    if args.ray_serve_config is not None and args.models is None:
        raise PlanError("--ray-serve-config", "renders a multi-model plan", "pass --models FILE.yml with it")
    if args.models is not None:
        if args.model or args.node or args.diff:
            raise PlanError(
                "--models", "plans several models: --model, --node and --diff do not go with it", "drop them"
            )
        return run_allocate(args)
    if not args.model:
        raise PlanError("--model", "is required", "name a catalog model or a model folder, or pass --models FILE.yml")
    cluster = load_cluster(args.cluster)
    spec = load_model(args.model)
    if args.diff:
        return run_diff(args, spec, cluster, _wishes(args))
    wishes = Wishes(**_wishes(args))
    result = plan_cluster(spec, cluster, wishes)
    _with_extra_args(result, list(wishes.extra_args))
    if args.node:
        if args.node not in [n["name"] for n in result["nodes"]]:
            raise PlanError("--node", f"{args.node!r} is not a node of {args.cluster}", "name one of its nodes")
        settings = interface.resolve(
            {
                "vllm_fleet_model": args.model,
                "vllm_fleet_runtime": args.runtime or "container",
                "vllm_fleet_vllm_version": args.vllm_version or CURRENT_VLLM,
            }
        )
        # As the plan phase computes it: a model folder on this machine is copied to the nodes.
        context = {"model_is_dir": Path(args.model).is_dir()}
        print(json.dumps(records.node_record(result, args.node, settings, context), indent=2))
        return 0
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_plan(result))
    return 0


def run_doctor(args: argparse.Namespace) -> int:

    if args.inventory:
        playbook = Path(__file__).resolve().parents[1] / "playbooks" / "doctor.yml"
        if not playbook.exists():
            raise PlanError(
                "--inventory", f"{playbook} is not here", "run from a vllm-fleet checkout, or pass --bundle"
            )
        with tempfile.TemporaryDirectory(prefix="vllm-fleet-doctor-") as tmp:
            bundle_path = Path(tmp) / "bundle.json"
            argv = [
                tools.tool("ansible-playbook", "--inventory"),
                str(playbook),
                "-i",
                tools.inventory(args.inventory),
                "-e",
                f"vllm_fleet_doctor_bundle={bundle_path}",
            ]
            # The playbook's own output goes to stderr: stdout is the doctor's lines (or JSON).
            done = subprocess.run(argv, stdout=sys.stderr, check=False, env=dict(os.environ))
            # A failing check also fails the playbook; only a missing bundle means gathering failed.
            if not bundle_path.exists():
                raise PlanError(
                    "--inventory",
                    f"gathering failed (ansible-playbook exit {done.returncode})",
                    "see its output above; unreachable nodes are named there",
                )
            text = bundle_path.read_text()
    else:
        try:
            text = args.bundle.read_text()
        except OSError as exc:
            raise PlanError(
                "--bundle", f"cannot read {args.bundle}: {exc.strerror}", "pass a file doctor.yml wrote"
            ) from exc
    try:
        checks = evaluate(json.loads(text))
    except (json.JSONDecodeError, BundleError) as exc:
        raise PlanError("--bundle", str(exc), "write it with playbooks/doctor.yml") from exc
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # A hand-edited or foreign bundle: name the field that broke, not a traceback.
        raise PlanError(
            "--bundle", f"malformed bundle ({type(exc).__name__}: {exc})", "write it with playbooks/doctor.yml"
        ) from exc
    print(to_json(checks) if args.json else render(checks))
    return exit_code(checks)


# Commands whose module loads only when they run: its run_args(args) returns the exit code.
ELSEWHERE = {"status": "vllm_fleet.ops.status", "kubernetes": "vllm_fleet.kube.command"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "estimate":
            return run_estimate(args)
        if args.command == "plan":
            return run_plan(args)
        if args.command == "doctor":
            return run_doctor(args)
        if args.command in ELSEWHERE:
            # Loaded for its command alone (pip loads its commands the same way): the status
            # reader's Prometheus parser is no import of the planner's commands.
            return int(importlib.import_module(ELSEWHERE[args.command]).run_args(args))
        if args.command == "calibrate":
            found = calibration(read_rows(args.verify))
            if args.json:
                print(json.dumps(found))
            else:
                print(f"# from {', '.join(found['from'])}: put this in the inventory (group_vars/all)")
                print(f"vllm_fleet_calibration: {{step_time: {found['step_time']}, ttft: {found['ttft']}}}")
            return 0
        if args.command == "models":
            for name in MODELS:
                print(name)
            return 0
        if args.command == "gpus":
            for gpu in GPUS.values():
                links = "unified memory" if gpu.unified_memory else "NVLink" if gpu.nvlink else ""
                sm = f"sm_{gpu.capability}" if gpu.device == "cuda" else ""
                print(f"{gpu.name:14} {gpu.memory_gib:8.2f} GiB  {gpu.arch:10} {sm:7} {links}".rstrip())
            return 0
    except DoesNotFitError as err:
        print(f"vllm-fleet {args.command}: error: {for_cli(err)}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    except PlanError as err:
        print(f"vllm-fleet {args.command}: error: {for_cli(err)}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def main_entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
