#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one short script for a lent GPU machine.
# Skips cleanly what the machine lacks; writes everything under ${OUT:-./gpu-out}.
#
#   OUT=/tmp/gpu-out bash tests/gpu/run.sh
#
# 1. gpu_facts' commands against the real nvidia-smi, saved as new parser fixtures
#    (copy them to tests/unit/fixtures/facts/<name>.*.txt), and the parser's verdict.
# 2. Where Docker and the NVIDIA container toolkit exist: docker run --gpus all nvidia-smi.
# 3. tests/gpu/serve_check.py: with vLLM (VLLM_PYTHON), real vllm serve through the vllm_server
#    role with --load-format dummy for a few configs, predicted vs reported KV tokens; with only
#    PyTorch, the CUDA context and the weights of each config on the device against the planner.
# 4. tests/gpu/perf_check.py: GEMM, HBM and attention efficiency at vLLM's shapes (PyTorch only)
#    beside the performance model's constants.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
status=0
say() { printf '[gpu] %s\n' "$*" | tee -a "$OUT/summary.txt"; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "SKIP no nvidia-smi on this machine"
  exit 0
fi
nvidia-smi --query-gpu=index,name,memory.total,memory.free,compute_cap,driver_version,pci.bus_id \
  --format=csv,noheader,nounits > "$OUT/query.txt" 2> "$OUT/query.err" || { say "FAIL nvidia-smi --query-gpu"; status=1; }
nvidia-smi -q -d COMPUTE > "$OUT/nvidia-smi-q.txt" 2>&1 || say "WARN nvidia-smi -q failed"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || say "WARN nvidia-smi topo -m failed"
for d in /sys/class/net/*; do
  echo "$(basename "$d") $(cat "$d/speed" 2>/dev/null || echo -1) $(cat "$d/operstate" 2>/dev/null || echo unknown)"
done > "$OUT/net.txt"
for p in /sys/class/infiniband/*/ports/*; do
  [ -e "$p/rate" ] || continue
  printf '%s\t%s\t%s\t%s\n' "$(basename "$(dirname "$(dirname "$p")")")" "$(basename "$p")" "$(cat "$p/rate")" "$(cat "$p/state")"
done > "$OUT/ib.txt"
df --block-size=1 --output=size /dev/shm > "$OUT/shm.txt"
(ulimit -l) > "$OUT/memlock.txt"

PY=$(command -v python3)
PYTHONPATH=. "$PY" - "$OUT" <<'PYEOF' | tee -a "$OUT/summary.txt"
import json, pathlib, sys
from vllm_fleet.inventory.facts import host_facts
out = pathlib.Path(sys.argv[1])
read = lambda name: (out / name).read_text() if (out / name).exists() else ""
facts = host_facts({"query_gpu": read("query.txt"), "nvidia_smi_q": read("nvidia-smi-q.txt"), "topo": read("topo.txt"),
                    "net": read("net.txt"), "ib": read("ib.txt"), "shm": read("shm.txt"), "memlock": read("memlock.txt")})
(out / "facts.json").write_text(json.dumps(facts, indent=1))
print(f"[gpu] facts: {facts['gpu_count']} x {facts['gpu']} {facts['gpu_memory_gib']} GiB, nvlink={facts['nvlink']}, "
      f"driver {facts['driver_version']}, CUDA {facts['cuda_version']}, cc {facts['compute_capability']}, "
      f"nic {facts['nic_gbps']} Gb/s, shm {facts['shm_bytes']}, memlock {facts['memlock_bytes']}")
sys.exit(0 if facts["gpu_count"] > 0 else 1)
PYEOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { say "FAIL the parser found no GPU in real nvidia-smi output"; status=1; }

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  if docker info 2>/dev/null | grep -qi nvidia; then
    image=${GPU_TEST_IMAGE:-}
    if [ -n "$image" ] && docker image inspect "$image" >/dev/null 2>&1; then
      docker run --rm --gpus all "$image" nvidia-smi -L > "$OUT/docker-gpus.txt" 2>&1 \
        && say "OK docker run --gpus all: $(wc -l < "$OUT/docker-gpus.txt") GPU(s)" \
        || { say "FAIL docker run --gpus all"; status=1; }
    else
      say "SKIP docker --gpus: set GPU_TEST_IMAGE to a local image with nvidia-smi (no registry is assumed)"
    fi
  else
    say "SKIP docker has no nvidia runtime"
  fi
else
  say "SKIP no usable docker"
fi
if PYTHONPATH=. "$PY" tests/gpu/perf_check.py "$OUT" 2>&1 | tee "$OUT/perf_check.txt"; then
  say "OK perf_check: GEMM, HBM and attention efficiency against the performance model's constants"
else
  say "FAIL perf_check (see perf_check.txt)"; status=1
fi
if PYTHONPATH=. "$PY" tests/gpu/serve_check.py "$OUT" 2>&1 | tee "$OUT/serve_check.txt"; then
  say "OK serve_check (see serve_check.txt)"
else
  say "FAIL serve_check (see serve_check.txt and serve-*.log)"; status=1
fi
exit $status
