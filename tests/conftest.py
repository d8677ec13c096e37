"""Shared fixtures: the repository root and small model folders."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

# Property tests draw the same examples on every run unless asked to explore: CI must not pass
# or fail by the draw (a fresh clone has no example database). VLLM_FLEET_HYPOTHESIS=explore
# draws new ones; what they find becomes a fixed test.
hypothesis_settings.register_profile("fixed", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("VLLM_FLEET_HYPOTHESIS", "fixed"))

ROOT = Path(__file__).resolve().parents[1]
# The node agents' package (vllm_fleet/agents), run as the roles run it: python3 FOLDER AGENT ...
AGENTS = ROOT / "vllm_fleet" / "agents"


def agent(name: str) -> list[str]:
    """The argv that runs node agent ``name`` from the checkout, as the roles run it on a node."""
    return [sys.executable, str(AGENTS), name]


sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
PLAYBOOK = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")


def run_playbook(
    playbook: str | Path, inventory: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook from the repository root with its ansible.cfg, output captured."""
    if PLAYBOOK is None:
        raise RuntimeError("ansible-playbook is not installed: make setup")
    full_env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **(env or {}))
    argv = [PLAYBOOK, str(playbook), "-i", str(inventory), *extra]
    try:
        return subprocess.run(
            argv, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        # A run killed at its timeout still tells which task it was in: its output so far, returned
        # as a failed run (returncode -9) that the caller's assertion shows with failures().
        def text(raw: bytes | str | None) -> str:
            return raw.decode(errors="replace") if isinstance(raw, bytes) else raw or ""

        stdout = f"{text(exc.stdout)}\nTIMED OUT: ansible-playbook {playbook} killed after {timeout:.0f} s\n"
        return subprocess.CompletedProcess(argv, -9, stdout, text(exc.stderr))


def run_site(inventory: Path, artifacts: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """site.yml with its artifacts written to ``artifacts``."""
    return run_playbook("site.yml", inventory, "-e", f"vllm_fleet_artifacts_dir={artifacts}", *extra, timeout=timeout)


def failures(done: subprocess.CompletedProcess[str], tail: int = 4000) -> str:
    """What to show when a playbook run fails: every failed task's block (the first is
    usually the cause, and scrolls out of a plain tail), then the end of the output."""
    lines = done.stdout.splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith(("fatal: [", "failed: [")) or "[ERROR]: Task failed" in line:
            blocks.append("\n".join(lines[max(0, i - 2) : i + 25]))
    head = "\n---\n".join(blocks[:4])
    return f"{head}\n=== end of output ===\n{done.stdout[-tail:]}{done.stderr[-2000:]}"


def filter_plugins(root: Path = ROOT) -> dict[str, Any]:
    """Every filter of plugins/filter/ (one file per filter), by name, as Ansible loads them."""
    found: dict[str, Any] = {}
    for path in sorted((root / "plugins" / "filter").glob("[!_]*.py")):
        found.update(load_script(path).FilterModule().filters())
    return found


def load_script(path: Path) -> ModuleType:
    """Import a standalone script (a role's files/*.py) as a module, to test its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header describes ``tensors`` (data zero-filled)."""
    sizes = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        handle.write(b"\0" * offset)


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """The local inventory's tiny Llama, with matching safetensors headers."""
    cfg = json.loads((ROOT / "inventories/local/files/tiny-llama/config.json").read_text())
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    h, inter, vocab, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": ("BF16", [vocab, h]),
        "lm_head.weight": ("BF16", [vocab, h]),
        "model.norm.weight": ("BF16", [h]),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = ("BF16", [q, h])
        tensors[p + "self_attn.k_proj.weight"] = ("BF16", [kv, h])
        tensors[p + "self_attn.v_proj.weight"] = ("BF16", [kv, h])
        tensors[p + "self_attn.o_proj.weight"] = ("BF16", [h, q])
        tensors[p + "mlp.gate_proj.weight"] = ("BF16", [inter, h])
        tensors[p + "mlp.up_proj.weight"] = ("BF16", [inter, h])
        tensors[p + "mlp.down_proj.weight"] = ("BF16", [h, inter])
        tensors[p + "input_layernorm.weight"] = ("BF16", [h])
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", [h])
    write_safetensors(folder / "model.safetensors", tensors)
    return folder
