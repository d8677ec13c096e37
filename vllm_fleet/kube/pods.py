"""From the planned launches of one instance to the pod templates that run it on Kubernetes.

The argv is the one the Ansible path runs (vllm_fleet/deploy/serve.py ``launches``, per node),
rewritten where Kubernetes decides instead of the plan: the pod binds every address
(a NetworkPolicy guards it), listens on :data:`PORT`, finds its leader through
LeaderWorkerSet's own environment (``LWS_LEADER_ADDRESS``, ``LWS_WORKER_INDEX``) and its
GPUs through the device plugin (no ``CUDA_VISIBLE_DEVICES``). A multi-node instance's
worker nodes must agree once their rank is templated: LeaderWorkerSet gives all workers
one pod template, so a difference between them is refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.errors import PlanError

PORT = 8000
RAY_PORT = 6379
MODEL_MOUNT = "/models"
HF_CACHE = "/root/.cache/huggingface"
LEADER = "$(LWS_LEADER_ADDRESS)"
POD_IP = "$(POD_IP)"  # the leader's own address: resolving its own DNS record races its start
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# Set by the node or the plan's host, not by a pod: the device plugin picks the GPUs,
# the pod's own interface is eth0, Ray's address is the pod's.
_DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                "RAY_ADDRESS", "VLLM_HOST_IP")  # fmt: skip
# Startup: what vLLM does besides reading weights (engine, torch.compile, CUDA graphs).
STARTUP_BASE_S = 300
PROBE_PERIOD_S = 10
# /dev/shm per local GPU rank (NCCL's shared-memory transport, vLLM's broadcast queues):
# LeaderWorkerSet's vLLM example gives 15 GiB to 8 GPUs.
SHM_GIB_PER_RANK = 2
# What a vLLM pod requests beside its GPUs (an assumption, not planned): the API server, the
# tokenizer and a worker per GPU rank on the CPUs, and host memory for loading and pinned buffers.
CPU_PER_RANK = 2
HOST_GIB = 8

# The Ray executor's pods (a fixed script: the argv arrives as "$@", never inside it).
RAY_LEADER = (
    'ray start --head --port={port} --node-ip-address="${{POD_IP}}" --num-gpus={gpus} --disable-usage-stats && '
    "python3 -c 'import os, time, ray\n"
    'ray.init(address="auto", logging_level="ERROR")\n'
    'want = int(os.environ["LWS_GROUP_SIZE"])\n'
    'while sum(1 for n in ray.nodes() if n["Alive"]) < want:\n'
    '    print("waiting for", want, "Ray nodes", flush=True); time.sleep(5)\' && exec "$@"'
)
# A worker waits for the head, then becomes its raylet: when Ray fails, the container exits and
# LeaderWorkerSet recreates the group (no retry loop hides it).
RAY_WORKER = (
    'until ray health-check --address="${{LWS_LEADER_ADDRESS}}:{port}" >/dev/null 2>&1; '
    "do echo waiting for the Ray head; sleep 5; done; "
    'exec ray start --address="${{LWS_LEADER_ADDRESS}}:{port}" --node-ip-address="${{POD_IP}}" '
    "--num-gpus={gpus} --disable-usage-stats --block"
)
# A DP worker's first rank: its index times its local ranks ($$ is Kubernetes' escape for $).
DP_WORKER = 'exec "$@" --data-parallel-start-rank "$$((LWS_WORKER_INDEX * {local}))"'


@dataclass
class Part:
    """One pod template: ``single`` (a Deployment's), ``leader`` or ``worker`` (LeaderWorkerSet's)."""

    role: str
    args: list[str]
    command: list[str]
    env: dict[str, str]
    gpus: int
    gpu: str
    device: str
    serves: bool
    weights_gib: float
    field_env: list[str] = field(default_factory=list)

    def key(self) -> tuple[Any, ...]:
        return (self.role, tuple(self.args), tuple(self.command), tuple(sorted(self.env.items())), self.gpus, self.gpu)


def _set(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    return out


def _pop(args: list[str], flag: str) -> tuple[list[str], str | None]:
    if flag not in args:
        return list(args), None
    i = args.index(flag)
    return args[:i] + args[i + 2 :], args[i + 1]


def part_of(inst: dict[str, Any], launch: dict[str, Any] | None, node: str, gpu: str, rdma: bool = False) -> Part:
    """The pod template of ``inst``'s part on ``node`` (whose GPU is ``gpu``); ``launch`` is that
    node's planned launch (None: a Ray worker, which runs no vllm serve of its own). ``rdma``: the
    pods get an RDMA device (NCCL finds it), else a group's NCCL uses sockets."""
    stages = [s for s in inst["stages"] if s["node"] == node]
    nodes = list(dict.fromkeys(s["node"] for s in inst["stages"]))
    rank = nodes.index(node)
    executor = str(inst.get("executor") or "mp")
    gpus = sum(int(s["gpu_count"]) for s in stages)
    device = str(inst.get("device") or "cuda")
    memory = inst.get("memory") or {}
    weights = float(memory.get("weights_gib") or 0) * (1 if device == "cpu" else gpus)
    role = "single" if len(nodes) == 1 else "leader" if rank == 0 else "worker"
    fields_ = ["POD_IP", "VLLM_HOST_IP"] if len(nodes) > 1 else []
    if launch is None:  # a Ray worker node
        script = RAY_WORKER.format(port=RAY_PORT, gpus=gpus)
        env0 = {} if rdma else {"NCCL_IB_DISABLE": "1"}
        return Part(role, [], ["/bin/sh", "-c", script], env0, gpus, gpu, device, False, weights, fields_)
    args = list(launch["argv"][1:])  # "serve", the model, flags ("vllm" is the command)
    args = _set(_set(args, "--host", "0.0.0.0"), "--port", str(PORT))
    env = {k: v for k, v in dict(launch["env"]).items() if k not in _DROPPED_ENV}
    command = ["vllm"]
    if executor == "native":
        args = _set(args, "--master-addr", POD_IP if rank == 0 else LEADER)
        args = _set(args, "--node-rank", "0" if rank == 0 else WORKER_INDEX)
    elif executor == "dp":
        args = _set(args, "--data-parallel-address", POD_IP if rank == 0 else LEADER)
        if rank > 0:
            args, start = _pop(args, "--data-parallel-start-rank")
            if start is None or int(start) != rank * gpus:
                raise PlanError(
                    "kubernetes",
                    f"{inst['name']}: node {node} starts at DP rank {start}, not its index x {gpus} local ranks",
                    "give every node of a DP instance the same GPU count",
                )
            command = ["/bin/sh", "-c", DP_WORKER.format(local=gpus), "vllm", "vllm"]
    elif executor == "ray":
        command = ["/bin/sh", "-c", RAY_LEADER.format(port=RAY_PORT, gpus=gpus), "vllm", "vllm"]
        env["RAY_ADDRESS"] = f"$(POD_IP):{RAY_PORT}"
    if len(nodes) > 1 and not rdma:
        env.setdefault("NCCL_IB_DISABLE", "1")
    return Part(role, args, command, env, gpus, gpu, device, rank == 0, weights, fields_)


def startup_failures(part: Part, load_gib_per_s: float) -> int:
    """The startup probe's failureThreshold: vLLM's start (:data:`STARTUP_BASE_S`) plus this pod's
    weights at ``load_gib_per_s``, in probe periods."""
    seconds = STARTUP_BASE_S + part.weights_gib / load_gib_per_s
    return max(30, math.ceil(seconds / PROBE_PERIOD_S))


def shm_gib(part: Part) -> int:
    return max(1, SHM_GIB_PER_RANK * max(1, part.gpus))
