"""What the Kubernetes rendering needs beyond the plan: where the objects go, the images,
the model volume, which Secrets hold the keys (by name, never a value), the gateway, and
how the GPU products the plan names are labelled on the nodes.

Each field is one ``vllm-fleet kubernetes`` flag (vllm_fleet/cli.py reads them from
:data:`FLAGS`, so a field and its flag are declared here once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from vllm_fleet.errors import PlanError

# GPU feature discovery's nvidia.com/gpu.product: nvidia-smi's product name, spaces as '-'.
# Only products whose name we know; any other is given with --gpu-product NAME=LABEL.
GPU_PRODUCTS: dict[str, str] = {
    "H100-SXM": "NVIDIA-H100-80GB-HBM3",
    "H100-PCIe": "NVIDIA-H100-PCIe",
    "H100-NVL": "NVIDIA-H100-NVL",
    "H200": "NVIDIA-H200",
    "H20": "NVIDIA-H20",
    "H800": "NVIDIA-H800",
    "B200": "NVIDIA-B200",
    "GB200": "NVIDIA-GB200",
    "A100-80G": "NVIDIA-A100-SXM4-80GB",
    "A100-40G": "NVIDIA-A100-SXM4-40GB",
    "A800": "NVIDIA-A800-SXM4-80GB",
    "A10": "NVIDIA-A10",
    "A10G": "NVIDIA-A10G",
    "A40": "NVIDIA-A40",
    "L40S": "NVIDIA-L40S",
    "L40": "NVIDIA-L40",
    "L20": "NVIDIA-L20",
    "L4": "NVIDIA-L4",
    "RTX-6000-Ada": "NVIDIA-RTX-6000-Ada-Generation",
    "RTX-A6000": "NVIDIA-RTX-A6000",
    "RTX-4090": "NVIDIA-GeForce-RTX-4090",
    "RTX-3090": "NVIDIA-GeForce-RTX-3090",
    "T4": "Tesla-T4",
    "V100-32G": "Tesla-V100-SXM2-32GB",
    "V100-16G": "Tesla-V100-SXM2-16GB",
}
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")
_SECRET = re.compile(r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?(:[-._a-zA-Z0-9]+)?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class KubeOptions:
    """The rendering's inputs beyond the plan (defaults: one namespace, the release's
    vllm-openai image, the model fetched from the Hub into the pod, no keys)."""

    name: str = field(default="vllm-fleet", metadata={"help": "prefix of every object's name and its part-of label"})
    namespace: str = field(default="vllm-fleet", metadata={"help": "namespace of every object"})
    image: str | None = field(
        default=None, metadata={"help": "serving image (default vllm/vllm-openai:v<the plan's release>)"}
    )
    model_pvc: str | None = field(
        default=None,
        metadata={
            "help": "PersistentVolumeClaim holding one folder per model, named as the model's last path part "
            "(mounted read-only at /models)"
        },
    )
    model_host_path: str | None = field(
        default=None,
        metadata={
            "help": "a folder on every node holding one folder per model, named as the model's last path part "
            "(a hostPath, mounted read-only at /models)"
        },
    )
    api_key_secret: str | None = field(
        default=None, metadata={"help": "Secret NAME[:KEY] (key default api-key) whose value vLLM takes as its API key"}
    )
    hf_token_secret: str | None = field(
        default=None, metadata={"help": "Secret NAME[:KEY] (key default token) holding the Hugging Face token"}
    )
    gateway_image: str = field(default="nginx:1.27", metadata={"help": "the gateway's nginx image (with njs)"})
    exporter_image: str = field(
        default="nginx/nginx-prometheus-exporter:1.4", metadata={"help": "the gateway's metrics exporter image"}
    )
    ray_image: str | None = field(
        default=None, metadata={"help": "with --ray-service: the Ray image with ray[serve,llm] and vLLM"}
    )
    monitoring_namespace: str = field(
        default="monitoring", metadata={"help": "the namespace Prometheus scrapes from (NetworkPolicy source)"}
    )
    load_gib_per_s: float = field(
        default=0.5, metadata={"help": "weights read rate per pod, GiB/s, which sizes the startup probe"}
    )
    gpu_product: tuple[str, ...] = field(
        default=(), metadata={"help": "GPU=LABEL: the nvidia.com/gpu.product label of a GPU the plan names (repeat)"}
    )
    rdma_resource: str | None = field(
        default=None,
        metadata={"help": "RESOURCE=COUNT of the RDMA device plugin (e.g. rdma/ib=1): NCCL over InfiniBand"},
    )
    ray_service: bool = field(
        default=False, metadata={"help": "a multi-model plan as a KubeRay RayService (Ray Serve LLM) instead"}
    )

    def __post_init__(self) -> None:
        for key in ("name", "namespace", "monitoring_namespace"):
            value = str(getattr(self, key))
            if not _NAME.match(value):
                raise PlanError(f"--{key.replace('_', '-')}", f"{value!r} is not a short DNS label", "e.g. vllm-fleet")
        for key in ("api_key_secret", "hf_token_secret"):
            value = getattr(self, key)
            if value is not None and not _SECRET.match(value):
                raise PlanError(
                    f"--{key.replace('_', '-')}",
                    f"{value!r} is not a Secret's NAME[:KEY]",
                    "name the Secret (and its key), never the value",
                )
        if self.model_pvc and self.model_host_path:
            raise PlanError("--model-pvc", "and --model-host-path both name the model volume", "give one")
        if self.model_host_path is not None and not self.model_host_path.startswith("/"):
            raise PlanError(
                "--model-host-path", f"{self.model_host_path!r} is not an absolute path", "e.g. /srv/models/X"
            )
        if not 0 < self.load_gib_per_s <= 100:
            raise PlanError("--load-gib-per-s", f"{self.load_gib_per_s} is out of range", "from 0.01 to 100 GiB/s")
        self.products()
        self.rdma()

    def products(self) -> dict[str, str]:
        """The catalog GPU name -> nvidia.com/gpu.product label, the flags' over the built-in."""
        out = dict(GPU_PRODUCTS)
        for item in self.gpu_product:
            gpu, _, label = item.partition("=")
            if not gpu or not label or not _LABEL_VALUE.match(label):
                raise PlanError("--gpu-product", f"{item!r} is not GPU=LABEL", "e.g. A800=NVIDIA-A800-SXM4-80GB")
            out[gpu] = label
        return out

    def rdma(self) -> tuple[str, int] | None:
        if self.rdma_resource is None:
            return None
        name, _, count = self.rdma_resource.partition("=")
        if not name or "/" not in name or not count.isdigit() or int(count) < 1:
            raise PlanError("--rdma-resource", f"{self.rdma_resource!r} is not RESOURCE=COUNT", "e.g. rdma/ib=1")
        return name, int(count)

    @staticmethod
    def secret_ref(value: str, default_key: str) -> dict[str, Any]:
        name, _, key = value.partition(":")
        return {"secretKeyRef": {"name": name, "key": key or default_key}}


FLAGS = tuple(f for f in fields(KubeOptions))
