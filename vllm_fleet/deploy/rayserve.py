"""A Ray Serve LLM application config from a multi-model plan (:func:`vllm_fleet.planning.allocate.combined_plan`),
for operators who want Ray Serve's autoscaling instead of vllm-fleet's fixed replicas.

``serve deploy`` accepts the result on a GPU cluster: one application running
``ray.serve.llm:build_openai_app`` (one OpenAI-compatible endpoint for every model), and one
``LLMConfig`` per model:

* ``model_loading_config``: the served name as ``model_id`` and the plan's model as ``model_source``;
* ``engine_kwargs``: the plan's ``vllm serve`` flags for the model's instances (TP, PP,
  max_model_len, max_num_seqs, gpu_memory_utilization, ...), as vLLM's engine keywords; the
  host, port and served name are Ray Serve's, so they are left out;
* ``accelerator_type``: Ray's name for the GPU the allocation gave the model (left out where
  Ray has none, e.g. A800 or H800: say so in the notes);
* ``placement_group_config``: one GPU bundle per worker (TP x PP), ``STRICT_PACK`` on one node,
  ``PACK`` when the plan spreads the pipeline over nodes;
* ``deployment_config.autoscaling_config``: ``min_replicas`` from the wish, ``max_replicas`` the
  replicas the allocation gave it, ``target_ongoing_requests`` the requests of max_model_len
  one replica's KV cache holds (at least 1);
* ``runtime_env.env_vars``: the plan's environment for the instances (e.g. a computed
  ``VLLM_PP_LAYER_PARTITION``), never a secret (those come from the cluster's environment).

A model placed on two GPU types (two layouts) gets the layout most of its replicas use: one
``model_id`` can have one engine config in Ray Serve LLM. Checked against Ray Serve's own
pydantic models (``ServeDeploySchema``, ``LLMConfig``) by tests/oracle/test_ray_serve_config.py.
Serving it needs GPUs: vLLM's CPU build refuses the Ray executor.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

RAY_VERSION = "2.60.0"
IMPORT_PATH = "ray.serve.llm:build_openai_app"

# Our GPU names (vllm_fleet/model/catalog.py) -> Ray's AcceleratorType values (ray.util.accelerators).
RAY_ACCELERATORS: dict[str, str] = {
    "H100-SXM": "H100",
    "H100-PCIe": "H100",
    "H100-NVL": "H100",
    "H200": "H200",
    "H20": "H20",
    "B200": "B200",
    "GB200": "GB200",
    "A100-80G": "A100-80G",
    "A100-40G": "A100-40G",
    "A10": "A10G",
    "A10G": "A10G",
    "L40S": "L40S",
    "L4": "L4",
    "RTX-PRO-6000": "RTX-PRO-6000",
    "T4": "T4",
    "V100-32G": "V100",
    "V100-16G": "V100",
}

# vllm serve flags that Ray Serve sets itself, or that name the model (model_loading_config).
_SERVE_OWNS = {"host", "port", "served_model_name", "api_key"}


def engine_kwargs(vllm_args: list[str]) -> dict[str, Any]:
    """``vllm serve MODEL --flag value ...`` as vLLM's engine keyword arguments."""
    kwargs: dict[str, Any] = {}
    args = vllm_args[2:] if vllm_args[:1] == ["serve"] else vllm_args[1:]
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            i += 1
            continue
        name = flag[2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            value: Any = _scalar(args[i + 1])
            i += 2
        else:
            value = True
            i += 1
        if name not in _SERVE_OWNS:
            kwargs[name] = value
    return kwargs


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _layout(instance: dict[str, Any]) -> tuple[str, int, int]:
    return (str(instance["gpu"]), int(instance["tensor_parallel_size"]), int(instance["pipeline_parallel_size"]))


def llm_config(model: dict[str, Any], instances: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """One model's LLMConfig, from its entry in the plan's ``models`` and its planned instances."""
    name = str(model["name"])
    layouts = Counter(_layout(i) for i in instances)
    (gpu, tp, pp), _ = layouts.most_common(1)[0]
    chosen = next(i for i in instances if _layout(i) == (gpu, tp, pp))
    if len(layouts) > 1:
        others = ", ".join(f"{g} TP={t} PP={p}" for (g, t, p) in layouts if (g, t, p) != (gpu, tp, pp))
        notes.append(f"{name}: one engine config per model in Ray Serve LLM; {gpu} TP={tp} PP={pp} kept, not {others}")
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": name, "model_source": str(chosen["model"])},
        "engine_kwargs": engine_kwargs(list(chosen["vllm_args"])),
        "placement_group_config": {
            "bundles": [{"GPU": 1} for _ in range(tp * pp)],
            "strategy": "STRICT_PACK" if len(chosen["nodes"]) == 1 else "PACK",
        },
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": int(model.get("min_replicas") or 1),
                "max_replicas": max(int(model.get("replicas") or 1), int(model.get("min_replicas") or 1)),
                "target_ongoing_requests": max(1, int(float(model["instances"][0].get("max_concurrency") or 1))),
            }
        },
    }
    accelerator = RAY_ACCELERATORS.get(gpu)
    if accelerator:
        config["accelerator_type"] = accelerator
    else:
        notes.append(f"{name}: Ray has no accelerator type for {gpu}; accelerator_type left out (any GPU node)")
    env = {k: str(v) for k, v in dict(chosen.get("env") or {}).items()}
    if env:
        config["runtime_env"] = {"env_vars": env}
    return config


def serve_config(plan: dict[str, Any], *, name: str = "vllm-fleet") -> tuple[dict[str, Any], list[str]]:
    """The Ray Serve application config for a multi-model plan, and notes on what it could not say."""
    if plan.get("strategy") != "models":
        raise ValueError("a Ray Serve LLM config is rendered from a multi-model plan (vllm_fleet_models)")
    notes: list[str] = []
    configs = []
    for model in plan["models"]:
        mine = [i for i in plan["instances"] if i.get("served_model_name") == model["name"]]
        if not mine:
            notes.append(f"{model['name']}: no instance planned; left out")
            continue
        configs.append(llm_config(model, mine, notes))
    app = {"name": name, "route_prefix": "/", "import_path": IMPORT_PATH, "args": {"llm_configs": configs}}
    return {"applications": [app]}, notes
