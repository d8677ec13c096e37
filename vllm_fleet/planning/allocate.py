"""Several models on one cluster: give each its GPUs, and say why (``vllm_fleet_models``).

The single-model planner (:func:`vllm_fleet.planning.strategy.plan_cluster`) decides every layout;
this module only splits the cluster between models:

1. For each model and each GPU type, the smallest footprint: the planner is asked to plan the
   model on one node of that type holding 1, 2, 4, ... GPUs; the first size it can plan is the
   model's instance there (its TP and PP are the planner's). When no single node holds it, the
   planner is asked for 2, 3, ... whole nodes of that type (PP across nodes, as it decides).
2. Models are placed in priority order (higher first; ties: the larger footprint first, so
   that big instances are not left without a node), ``min_replicas`` instances each; then
   more instances, in the same order, up to each model's wish (``replicas``, or the instances
   ``target_concurrency`` takes at the planner's max concurrency per instance, or the instances
   its ``workload``'s ``request_rate`` takes at the requests/s one instance serves within its
   ``slo``, from the performance model) while GPUs remain.
3. An instance's GPUs are explicit (node, GPU indices): a GPU belongs to one instance, unless
   the models on it set ``gpu_memory_share`` (then that share is the instance's
   ``gpu_memory_utilization``, and the shares on one GPU add up to at most
   :data:`MAX_SHARED_UTILIZATION`).

When the cluster cannot hold every model at its minimum, :class:`PlanError` names the models
that do not fit and what does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet import coerce, schema
from vllm_fleet.accounting.base import CURRENT_VLLM
from vllm_fleet.accounting.refusal import vllm_refusal
from vllm_fleet.accounting.settings import LIMITS
from vllm_fleet.errors import DoesNotFitError, NothingFitsError, PlanError
from vllm_fleet.model.spec import ModelSpec, load_model
from vllm_fleet.names import check_served_name
from vllm_fleet.planning.cluster import Node, _UniqueKeyLoader
from vllm_fleet.planning.render import DEFAULT_PORT
from vllm_fleet.planning.strategy import Wishes, plan_cluster
from vllm_fleet.planning.table import format_table

FIELD = "vllm_fleet_models"
# vLLM starts an instance only when the GPU's free memory holds its whole budget
# (gpu_memory_utilization x total, v1/worker/utils.py request_memory); the CUDA contexts and the
# driver's own reservation live outside every budget, so shares on one GPU stay below 1.
MAX_SHARED_UTILIZATION = 0.95
MAX_MODELS = 64
# Single-node sizes tried, smallest first (the planner's TP sizes: powers of two and 3, 6, 12).
_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512, 1024)

_KEYS = {
    "model": "catalog name or model folder",
    "served_model_name": "name clients ask for",
    "max_model_len": "context length",
    "target_concurrency": "requests at max_model_len to serve at once",
    "min_replicas": "instances it must get",
    "replicas": "instances wished (default: from target_concurrency, else the workload's request_rate within the slo)",
    "priority": "higher is placed first",
    "gpu_memory_share": "fraction of each GPU, to share GPUs with other models",
    "gpu_memory_utilization": "as vllm serve's",
    "quantization": "as vllm serve's",
    "dtype": "as vllm serve's",
    "kv_cache_dtype": "as vllm serve's",
    "tensor_parallel_size": "force TP",
    "pipeline_parallel_size": "force PP",
    "max_num_seqs": "as vllm serve's",
}


@dataclass(frozen=True)
class ModelWish:
    """One entry of ``vllm_fleet_models``."""

    model: str
    served_model_name: str | None = None
    max_model_len: int | None = None
    target_concurrency: int | None = None
    min_replicas: int = 1
    replicas: int | None = None
    priority: int = 0
    gpu_memory_share: float | None = None
    gpu_memory_utilization: float | None = None
    quantization: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    max_num_seqs: int | None = None
    # Any other declared option (vllm_fleet/schema.py) the entry sets, typed: this model's own
    # value over the deployment-wide vllm_fleet_<name> (LoRA, speculative decoding, ...).
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Footprint:
    """The smallest instance of a model on one GPU type: GPUs per node it spans."""

    gpu_key: str
    gpu: str
    stage_gpus: tuple[int, ...]  # GPUs on each node the instance spans (one entry: one node)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_concurrency: float
    # Requests/s one instance serves within the model's SLO (the performance model; 0: none).
    slo_capacity: float = 0.0

    @property
    def gpus(self) -> int:
        return sum(self.stage_gpus)

    def describe(self) -> str:
        where = (
            f"{self.gpus} {self.gpu} GPU(s) on one node"
            if len(self.stage_gpus) == 1
            else f"{len(self.stage_gpus)} {self.gpu} nodes x {self.stage_gpus[0]} GPUs"
        )
        return f"TP={self.tensor_parallel_size} PP={self.pipeline_parallel_size} on {where}"


@dataclass
class Instance:
    name: str
    model: str
    footprint: Footprint
    gpus: dict[str, list[int]]  # node -> GPU indices
    share: float | None
    plan: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        inst = self.plan["instances"][0]
        return {
            "name": self.name,
            "nodes": list(self.gpus),
            "gpu_ids": {n: list(ids) for n, ids in self.gpus.items()},
            "gpu": self.footprint.gpu,
            "tensor_parallel_size": inst["tensor_parallel_size"],
            "pipeline_parallel_size": inst["pipeline_parallel_size"],
            "gpu_memory_share": self.share,
            "endpoint": inst["endpoint"],
            "max_concurrency": inst["memory"]["max_concurrency"],
            "plan": self.plan,
        }


@dataclass
class ModelAllocation:
    wish: ModelWish
    name: str  # the served name
    spec: ModelSpec
    footprints: list[Footprint]
    wanted: int
    instances: list[Instance] = field(default_factory=list)
    denied: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.wish.model,
            "priority": self.wish.priority,
            "min_replicas": self.wish.min_replicas,
            "wanted_replicas": self.wanted,
            "replicas": len(self.instances),
            "footprints": [
                {
                    "gpu": f.gpu,
                    "gpus": f.gpus,
                    "stage_gpus": list(f.stage_gpus),
                    "tensor_parallel_size": f.tensor_parallel_size,
                    "pipeline_parallel_size": f.pipeline_parallel_size,
                    "max_concurrency": f.max_concurrency,
                }
                for f in self.footprints
            ],
            "instances": [i.to_dict() for i in self.instances],
            "denied": self.denied,
        }


@dataclass
class Allocation:
    models: list[ModelAllocation]
    nodes: list[Node]
    # (node, GPU index) -> [(instance name, share or None)]
    gpus: dict[tuple[str, int], list[tuple[str, float | None]]]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": [m.to_dict() for m in self.models],
            "gpus": [
                {
                    "node": node.name,
                    "gpu": node.gpu,
                    "index": i,
                    "assigned": [{"instance": n, "gpu_memory_share": s} for n, s in self.gpus[(node.name, i)]],
                }
                for node in self.nodes
                for i in range(node.gpu_count)
            ],
            "free_gpus": sum(1 for v in self.gpus.values() if not v),
            "warnings": self.warnings,
        }


# -- reading the wishes -----------------------------------------------------------


def _where(index: int, wish: Mapping[str, Any] | None = None) -> str:
    name = wish.get("model") if isinstance(wish, Mapping) else None
    return f"{FIELD}[{index}]" + (f" ({name})" if isinstance(name, str) else "")


def _int(raw: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not minimum <= raw <= maximum:
        raise PlanError(where, f"must be a whole number from {minimum} to {maximum:,}, got {raw!r}", "e.g. 1")
    return raw


def wish_from_dict(data: Any, index: int) -> ModelWish:
    """One ``vllm_fleet_models`` entry: a catalog name or folder, or a mapping of :data:`_KEYS`."""
    if isinstance(data, str):
        data = {"model": data}
    where = _where(index, data if isinstance(data, Mapping) else None)
    if not isinstance(data, Mapping):
        raise PlanError(where, f"must be a mapping with model:, got {data!r}", "e.g. {model: meta-llama/Llama-3.1-8B}")
    data = dict(data)
    if "name" in data and "model" not in data:
        data["model"] = data.pop("name")
    shared = sorted(
        k for k in data if k not in _KEYS and k in schema.by_name() and schema.by_name()[k].option.deployment
    )
    if shared:
        raise PlanError(
            f"{where}.{shared[0]}",
            "is one value for the whole deployment, not one model's",
            f"set {schema.PREFIX}{shared[0]} in the inventory instead",
        )
    unknown = sorted(set(data) - set(_KEYS) - set(schema.by_name()), key=str)
    if unknown:
        raise PlanError(
            f"{where}.{unknown[0]}",
            "is not a model wish",
            f"use some of {sorted(_KEYS)}, or a declared option (a vllm_fleet_<name> variable, without the prefix)",
        )
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise PlanError(f"{where}.model", "is missing", "name a catalog model or a model folder")
    kwargs: dict[str, Any] = {"model": model.strip()}
    for key in ("max_model_len", "target_concurrency", "tensor_parallel_size", "pipeline_parallel_size",
                "max_num_seqs"):  # fmt: skip
        if data.get(key) is not None:
            kwargs[key] = _int(data[key], f"{where}.{key}", 1, LIMITS[key])
    for key in ("min_replicas", "replicas"):
        if data.get(key) is not None:
            kwargs[key] = _int(data[key], f"{where}.{key}", 0 if key == "min_replicas" else 1, 1 << 16)
    if data.get("priority") is not None:
        kwargs["priority"] = _int(data["priority"], f"{where}.priority", -(1 << 30), 1 << 30)
    for key in ("gpu_memory_share", "gpu_memory_utilization"):
        raw = data.get(key)
        if raw is None:
            continue
        top = MAX_SHARED_UTILIZATION if key == "gpu_memory_share" else 1.0
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= top:
            raise PlanError(f"{where}.{key}", f"must be in (0, {top:g}], got {raw!r}", "e.g. 0.45")
        kwargs[key] = float(raw)
    if "gpu_memory_share" in kwargs and "gpu_memory_utilization" in kwargs:
        raise PlanError(
            f"{where}.gpu_memory_share",
            "and gpu_memory_utilization are both set",
            "keep gpu_memory_share: it is the instance's gpu_memory_utilization",
        )
    for key in ("served_model_name", "quantization", "dtype", "kv_cache_dtype"):
        raw = data.get(key)
        if raw is None:
            continue
        if not isinstance(raw, str) or not raw.strip():
            raise PlanError(f"{where}.{key}", f"must be a string, got {raw!r}", f"give the {_KEYS[key]}")
        kwargs[key] = raw.strip()
    options = {
        key: coerce.declared(key, raw, f"{where}.{key}")
        for key, raw in data.items()
        if key not in _KEYS and raw is not None
    }
    wish = ModelWish(**kwargs, options=options)
    if wish.replicas is not None and wish.replicas < wish.min_replicas:
        raise PlanError(
            f"{where}.replicas", f"{wish.replicas} is below min_replicas {wish.min_replicas}", "raise replicas"
        )
    return wish


def wishes_from_data(data: Any) -> list[ModelWish]:
    """``{vllm_fleet_models: [...]}``, ``{models: [...]}`` or a bare list."""
    raw = data
    if isinstance(data, Mapping):
        raw = data.get(FIELD, data.get("models"))
    if not isinstance(raw, list) or not raw:
        raise PlanError(FIELD, "lists no models", "write vllm_fleet_models: [{model: ..., min_replicas: 1}, ...]")
    if len(raw) > MAX_MODELS:
        raise PlanError(FIELD, f"{len(raw)} models is above {MAX_MODELS}", "plan fewer models on one cluster")
    return [wish_from_dict(item, i) for i, item in enumerate(raw)]


def load_wishes(path: Path) -> list[ModelWish]:

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError("--models", f"cannot read {path}: {exc}", "pass a YAML file with vllm_fleet_models:") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise PlanError("--models", f"{path} is not valid YAML ({problem})", "fix the YAML syntax") from exc
    return wishes_from_data(data)


# -- footprints -------------------------------------------------------------------


# The deployment-wide wishes (the inventory's vllm_fleet_* values) every model inherits unless
# its own entry says otherwise; the rest (served name, layout, concurrency, quantization) is
# each model's own.
SHARED_WISHES = (
    *(d.name for d in schema.declared() if not d.option.per_model),
    "extra_args", "extra_env", "ray_available",
)  # fmt: skip


def _planner_wishes(
    wish: ModelWish, served: str, port: int = DEFAULT_PORT, base: Mapping[str, Any] | None = None
) -> Wishes:
    shared = {k: v for k, v in (base or {}).items() if k in SHARED_WISHES and v is not None}
    own = {
        "max_model_len": wish.max_model_len,
        "gpu_memory_utilization": wish.gpu_memory_share or wish.gpu_memory_utilization,
        "dtype": wish.dtype,
        "quantization": wish.quantization,
        "kv_cache_dtype": wish.kv_cache_dtype,
        "tensor_parallel_size": wish.tensor_parallel_size,
        "pipeline_parallel_size": wish.pipeline_parallel_size,
        "max_num_seqs": wish.max_num_seqs,
    }
    merged: dict[str, Any] = {
        "vllm_version": CURRENT_VLLM,
        **shared,
        **wish.options,
        **{k: v for k, v in own.items() if v is not None},
    }
    return Wishes(**merged, model_ref=wish.model, served_model_name=served, port=port)


def _groups(nodes: list[Node]) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(node.gpu_key, []).append(node)
    return groups


def _stage_gpus(plan: dict[str, Any]) -> tuple[int, ...]:
    """GPUs per node of the plan's first instance, in stage order."""
    per_node: dict[str, int] = {}
    for stage in plan["instances"][0]["stages"]:
        per_node[stage["node"]] = per_node.get(stage["node"], 0) + stage["gpu_count"]
    return tuple(per_node.values())


def _denials(plan: dict[str, Any], gpu: str, seen: list[dict[str, str]]) -> list[dict[str, str]]:
    """The layouts the planner refused (not those that fit but ranked lower), each once."""
    out: list[dict[str, str]] = []
    for r in plan["rejected"]:
        entry = {"gpu": gpu, "layout": r["layout"], "reason": r["reason"]}
        if not r["reason"].startswith("fits, but") and entry not in seen and entry not in out:
            out.append(entry)
    return out


def find_footprints(
    spec: ModelSpec,
    wish: ModelWish,
    served: str,
    nodes: list[Node],
    denied: list[dict[str, str]],
    base: Mapping[str, Any] | None = None,
) -> list[Footprint]:
    """The model's smallest instance on each GPU type, fewest GPUs first (ties: the smaller
    GPU, so that the large ones stay for the models that need them). Layouts the planner
    refused are appended to ``denied``."""
    found: list[Footprint] = []
    other: PlanError | None = None
    planner = _planner_wishes(wish, served, base=base)
    for group in _groups(nodes).values():
        first = group[0]
        refusal = vllm_refusal(spec, first.device(), wish.dtype, wish.quantization, wish.kv_cache_dtype, CURRENT_VLLM)
        if refusal is not None:
            denied.append({"gpu": first.gpu, "layout": "any", "reason": refusal.problem})
            continue
        largest = max(group, key=lambda n: n.gpu_count)
        forced = (wish.tensor_parallel_size or 1) * (wish.pipeline_parallel_size or 1)
        sizes = sorted({s for s in (*_SIZES, *(n.gpu_count for n in group)) if forced <= s <= largest.gpu_count})
        subclusters = [[replace(largest, gpu_count=s)] for s in sizes]
        same = [n for n in group if n.gpu_count == largest.gpu_count]
        subclusters += [same[:m] for m in range(2, len(same) + 1)]
        last: PlanError | None = None
        for sub in subclusters:
            try:
                plan = plan_cluster(spec, sub, planner)
            except NothingFitsError as err:
                last = err
                continue
            except PlanError as err:
                other = other or err
                last = err
                continue
            inst = plan["instances"][0]
            denied.extend(_denials(plan, first.gpu, denied))
            found.append(
                Footprint(
                    first.gpu_key,
                    first.gpu,
                    _stage_gpus(plan),
                    inst["tensor_parallel_size"],
                    inst["pipeline_parallel_size"],
                    float(inst["memory"]["max_concurrency"]),
                    float((inst.get("performance") or {}).get("slo_capacity") or 0.0),
                )
            )
            break
        else:
            if last is not None:
                denied.append({"gpu": first.gpu, "layout": "any", "reason": last.problem})
    if not found and other is not None:
        raise other
    memory = {n.gpu_key: n.gpu_memory_gib for n in nodes}
    return sorted(found, key=lambda f: (f.gpus, memory[f.gpu_key]))


# -- placement --------------------------------------------------------------------


class _Gpus:
    """Who holds each GPU: [(instance, share or None)]; None is a whole GPU."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.held: dict[tuple[str, int], list[tuple[str, float | None]]] = {
            (n.name, i): [] for n in nodes for i in range(n.gpu_count)
        }

    def usable(self, node: Node, share: float | None) -> list[int]:
        """GPU indices of ``node`` an instance with ``share`` can use, the fullest first."""
        out = []
        for i in range(node.gpu_count):
            held = self.held[(node.name, i)]
            if share is None:
                if not held:
                    out.append(i)
            elif all(s is not None for _, s in held) and sum(s or 0 for _, s in held) + share <= (
                MAX_SHARED_UTILIZATION + 1e-9
            ):
                out.append(i)
        return sorted(out, key=lambda i: (-sum(s or 0 for _, s in self.held[(node.name, i)]), i))

    def free(self, node: Node) -> int:
        return sum(1 for i in range(node.gpu_count) if not self.held[(node.name, i)])

    def place(self, fp: Footprint, share: float | None) -> dict[str, list[int]] | None:
        """GPUs for one instance of ``fp``: each stage on its own node of the GPU type, the
        nodes with the least room that still hold it first (best fit, against fragmentation)."""
        candidates = []
        for node in self.nodes:
            if node.gpu_key != fp.gpu_key:
                continue
            ids = self.usable(node, share)
            candidates.append((len(ids), node.name, node, ids))
        chosen: dict[str, list[int]] = {}
        for need in fp.stage_gpus:
            fitting = sorted((c for c in candidates if c[0] >= need and c[1] not in chosen), key=lambda c: c[:2])
            if not fitting:
                return None
            _, name, _, ids = fitting[0]
            chosen[name] = sorted(ids[:need])
        return chosen

    def take(self, name: str, gpus: dict[str, list[int]], share: float | None) -> None:
        for node, ids in gpus.items():
            for i in ids:
                self.held[(node, i)].append((name, share))

    def most_free(self, gpu_key: str) -> int:
        return max((self.free(n) for n in self.nodes if n.gpu_key == gpu_key), default=0)


def _instance_plan(
    spec: ModelSpec,
    wish: ModelWish,
    served: str,
    nodes: list[Node],
    gpus: dict[str, list[int]],
    port: int,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The single-model plan of one placed instance: the planner on exactly its GPUs, with
    the GPU indices it was given."""
    by_name = {n.name: n for n in nodes}
    sub = [replace(by_name[name], gpu_count=len(ids)) for name, ids in gpus.items()]
    plan = plan_cluster(spec, sub, _planner_wishes(wish, served, port, base))
    plan["instances"] = plan["instances"][:1]
    plan["gateway"]["upstreams"] = plan["gateway"]["upstreams"][:1]
    plan["gateway"]["enabled"] = False
    offset = {name: 0 for name in gpus}
    for stage in plan["instances"][0]["stages"]:
        ids = gpus[stage["node"]]
        start = offset[stage["node"]]
        stage["gpu_ids"] = ids[start : start + stage["gpu_count"]]
        offset[stage["node"]] = start + stage["gpu_count"]
    return plan


def _wanted(wish: ModelWish, fp: Footprint) -> int:
    if wish.replicas is not None:
        return wish.replicas
    if wish.target_concurrency is not None and fp.max_concurrency > 0:
        return max(wish.min_replicas, math.ceil(wish.target_concurrency / fp.max_concurrency))
    rate = (wish.options.get("workload") or {}).get("request_rate")
    if rate and fp.slo_capacity > 0:
        # The model's own workload and SLO: enough instances to serve its rate within the SLO.
        return max(wish.min_replicas, math.ceil(float(rate) / fp.slo_capacity))
    return max(wish.min_replicas, 1)


def allocate(models: list[ModelWish], nodes: list[Node], base: Mapping[str, Any] | None = None) -> Allocation:
    """Split ``nodes`` between ``models``; raises :class:`PlanError` (field ``vllm_fleet_models``)
    when they do not all fit at their ``min_replicas``. ``base``: the deployment-wide wishes
    (:data:`SHARED_WISHES` of them, and ``port``, the first port on every node)."""
    if not models:
        raise PlanError(FIELD, "lists no models", "write vllm_fleet_models: [{model: ...}, ...]")
    allocations: list[ModelAllocation] = []
    served_seen: dict[str, int] = {}
    for index, wish in enumerate(models):
        where = f"{FIELD}[{index}] ({wish.model})"
        try:
            spec = load_model(wish.model)
        except PlanError as err:
            raise PlanError(where, err.problem, err.fix) from err
        served = check_served_name(wish.served_model_name or spec.name.rstrip("/").split("/")[-1])
        if served in served_seen:
            raise PlanError(
                f"{where}.served_model_name",
                f"{served!r} is also the name of {FIELD}[{served_seen[served]}]",
                "give each model its own served_model_name",
            )
        served_seen[served] = index
        denied: list[dict[str, str]] = []
        try:
            footprints = find_footprints(spec, wish, served, nodes, denied, base)
        except PlanError as err:
            raise PlanError(where, f"{err.field}: {err.problem}", err.fix) from err
        if not footprints:
            reasons = "; ".join(f"on {d['gpu']}: {d['reason']}" for d in denied if d["layout"] == "any")
            raise DoesNotFitError(
                where,
                f"fits on no GPU type of the cluster ({reasons})",
                "set a lower max_model_len or a quantization for it, or add larger GPUs",
            )
        allocations.append(ModelAllocation(wish, served, spec, footprints, _wanted(wish, footprints[0]), [], denied))

    order = sorted(
        range(len(allocations)),
        key=lambda i: (-allocations[i].wish.priority, -allocations[i].footprints[0].gpus, i),
    )
    gpus = _Gpus(nodes)
    ports: dict[str, int] = {}

    def add(alloc: ModelAllocation) -> bool:
        share = alloc.wish.gpu_memory_share
        for fp in alloc.footprints:
            where = gpus.place(fp, share)
            if where is None:
                continue
            name = f"{alloc.name}-{len(alloc.instances)}"
            head = next(iter(where))
            port = int((base or {}).get("port") or DEFAULT_PORT) + ports.get(head, 0)
            ports[head] = ports.get(head, 0) + 1
            plan = _instance_plan(alloc.spec, alloc.wish, alloc.name, nodes, where, port, base)
            plan["instances"][0]["name"] = name
            gpus.take(name, where, share)
            alloc.instances.append(Instance(name, alloc.name, fp, where, share, plan))
            return True
        return False

    short: list[tuple[ModelAllocation, Footprint]] = []
    for i in order:
        alloc = allocations[i]
        while len(alloc.instances) < alloc.wish.min_replicas:
            if not add(alloc):
                short.append((alloc, alloc.footprints[0]))
                break
    if short:
        raise _does_not_fit(allocations, short, gpus)
    warnings: list[str] = []
    for i in order:
        alloc = allocations[i]
        while len(alloc.instances) < alloc.wanted:
            if not add(alloc):
                break
        if len(alloc.instances) < alloc.wanted:
            warnings.append(
                f"{alloc.name}: {len(alloc.instances)} of the {alloc.wanted} instances wished fit "
                f"(each needs {alloc.footprints[0].describe()})"
            )
    for alloc in allocations:
        if not alloc.instances:
            # min_replicas 0 and no room: still say why it got nothing.
            alloc.denied.append({"gpu": "any", "layout": "placement", "reason": "no GPUs left after higher priorities"})
        for fp in alloc.footprints[1:]:
            if alloc.instances and all(inst.footprint != fp for inst in alloc.instances):
                alloc.denied.append(
                    {
                        "gpu": fp.gpu,
                        "layout": fp.describe(),
                        "reason": f"fits, but {alloc.footprints[0].describe()} takes fewer or smaller GPUs",
                    }
                )
    return Allocation(allocations, nodes, gpus.held, warnings)


def _does_not_fit(
    allocations: list[ModelAllocation], short: list[tuple[ModelAllocation, Footprint]], gpus: _Gpus
) -> DoesNotFitError:
    lacking = {id(a) for a, _ in short}
    fits = ", ".join(f"{a.name} x{len(a.instances)}" for a in allocations if id(a) not in lacking) or "nothing"
    missing = []
    for alloc, fp in short:
        free = gpus.most_free(fp.gpu_key)
        missing.append(
            f"{alloc.name} (min_replicas {alloc.wish.min_replicas}, {len(alloc.instances)} placed; "
            f"an instance needs {fp.describe()}, the most free on one {fp.gpu} node is {free})"
        )
    fixes = [f"lower min_replicas of {a.name} to {len(a.instances)}" for a, _ in short if a.instances]
    others = [a.name for a in allocations if id(a) not in lacking and a.wish.min_replicas > 1]
    if others:
        fixes.append(f"lower min_replicas of {', '.join(others)}")
    fixes.append("lower the priority of a model that fits, drop a model, or add a node")
    return DoesNotFitError(
        FIELD,
        f"the cluster cannot hold every model at its minimum: fits: {fits}; does not fit: {'; '.join(missing)}",
        ", or ".join(fixes),
    )


# -- output -----------------------------------------------------------------------


def render_allocation(result: Allocation) -> str:
    layouts = {
        inst.name: f"TP{inst.footprint.tensor_parallel_size} PP{inst.footprint.pipeline_parallel_size}"
        for m in result.models
        for inst in m.instances
    }
    rows = []
    for node in result.nodes:
        for i in range(node.gpu_count):
            held = result.gpus[(node.name, i)]
            who = " + ".join(f"{n} ({s:g})" if s is not None else n for n, s in held) or "free"
            rows.append([node.name, str(i), node.gpu, who, ", ".join(dict.fromkeys(layouts[n] for n, _ in held))])
    used = sum(1 for v in result.gpus.values() if v)
    lines = [
        f"Allocation of {len(result.models)} model(s) on {len(result.nodes)} node(s), "
        f"{len(result.gpus)} GPU(s): {used} used, {len(result.gpus) - used} free",
        "",
        format_table(["node", "gpu", "type", "instance", "layout"], rows),
        "",
    ]
    model_rows = []
    for m in result.models:
        conc = sum(i.plan["instances"][0]["memory"]["max_concurrency"] for i in m.instances)
        model_rows.append(
            [
                m.name,
                str(m.wish.priority),
                f"{len(m.instances)}/{m.wanted} (min {m.wish.min_replicas})",
                m.footprints[0].describe(),
                f"{conc:.1f}x",
                ", ".join(i.plan["instances"][0]["endpoint"] for i in m.instances),
            ]
        )
    lines.append(format_table(["model", "prio", "instances", "smallest instance", "conc.", "endpoints"], model_rows))
    for warn in result.warnings:
        lines.append(f"warning: {warn}")
    for m in result.models:
        if m.denied:
            lines += ["", f"Denied layouts of {m.name}:"]
            for d in m.denied[:12]:
                lines.append(f"  - {d['layout']} ({d['gpu']}): {d['reason']}")
            if len(m.denied) > 12:
                lines.append(f"  ... {len(m.denied) - 12} more (see --json)")
    return "\n".join(lines)


# -- one plan for the deployment ----------------------------------------------------


def combined_plan(result: Allocation) -> dict[str, Any]:
    """The allocation as one plan of the shape :func:`vllm_fleet.planning.strategy.plan_cluster`
    returns, so that the node records (vllm_fleet/deploy/records.py), verify and the gateway read a
    multi-model deployment as they read a single-model one:

    * ``instances``: every instance of every model, each with its own ``served_model_name``,
      its ``model`` (the wish's catalog name or folder: the launch's model argument) and its
      GPU indices;
    * ``gateway``: in front of all of them when there are several, with ``routes`` (each
      model's served name and upstreams, which the gateway routes a request to by the
      ``model`` its body names);
    * ``models`` and ``allocation_table``: who got what, for the tables and artifacts.
    """
    instances: list[dict[str, Any]] = []
    routes: list[dict[str, Any]] = []
    for alloc in result.models:
        endpoints = []
        for inst in alloc.instances:
            planned = dict(inst.plan["instances"][0])
            planned["model"] = alloc.wish.model
            planned["served_model_name"] = alloc.name
            instances.append(planned)
            endpoints.append(str(planned["endpoint"]))
        if endpoints:
            routes.append({"model": alloc.name, "upstreams": endpoints})
    names = ", ".join(m.name for m in result.models)
    versions = sorted({str(i.get("vllm_version")) for i in instances if i.get("vllm_version")})
    summary = "; ".join(f"{m.name} x{len(m.instances)} ({m.footprints[0].describe()})" for m in result.models)
    models = result.to_dict()
    for model in models["models"]:
        for inst in model["instances"]:
            inst.pop("plan", None)  # the instances themselves are the plan's
    return {
        "model": f"{len(result.models)} models ({names})",
        "model_source": "vllm_fleet_models",
        "vllm_version": versions[0] if versions else CURRENT_VLLM,
        "summary": summary,
        "strategy": "models",
        "cluster": {"nodes": len(result.nodes), "gpus": sum(n.gpu_count for n in result.nodes)},
        "nodes": [
            {"name": n.name, "gpu": n.gpu, "gpu_count": n.gpu_count, "address": n.address, "interface": n.interface}
            for n in result.nodes
        ],
        "instances": instances,
        "gateway": {
            "enabled": len(instances) > 1,
            "strategy": "least_conn",
            "upstreams": [str(i["endpoint"]) for i in instances],
            "routes": routes,
        },
        "warnings": list(result.warnings),
        "rejected": [],  # each model's denied layouts are in the allocation table and ``models``
        "ranking": [],
        "models": models["models"],
        "gpus": models["gpus"],
        "allocation_table": render_allocation(result),
    }
