"""vLLM's own code as the planner's oracle.

The planner models vLLM's accounting without importing it; these tests run vLLM's CPU build
(the same KV-spec, state-shape and profiling code as the GPU build) in a separate interpreter
on shrunk configs and compare its numbers with the planner's.

The interpreter: ``VLLM_FLEET_ORACLE_PYTHON``, else the oracle venv CI builds from the hosts'
wheel folder (``python -m tests.hosts oracle``). Without one the tests skip, unless
``VLLM_FLEET_ORACLE_REQUIRED=1`` (CI sets it), where a missing oracle fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.common import CACHE

OracleRun = Callable[[str, Any], Any]

# A torchvision stand-in for oracle code that builds a model whose processor module imports
# torchvision at the top (Gemma 4's image processor) while vLLM's CPU build has none: a package of
# modules whose every attribute is a class, on sys.path and on the PYTHONPATH of the subprocess
# vLLM's model registry inspects the model in. Nothing is run through it.
TORCHVISION_STUB = r"""
import os, sys, tempfile
_stub_root = tempfile.mkdtemp()
_body = (
    "__version__ = '0.0.0'\n"
    "class _Meta(type):\n"
    "    def __getattr__(cls, attr):\n"
    "        if attr.startswith('__'):\n"
    "            raise AttributeError(attr)\n"
    "        return _Meta(attr, (), {})\n"
    "def __getattr__(attr):\n"
    "    if attr.startswith('__'):\n"
    "        raise AttributeError(attr)\n"
    "    return _Meta(attr, (), {})\n"
)
for _rel in ("torchvision/__init__.py", "torchvision/io/__init__.py", "torchvision/transforms/__init__.py",
             "torchvision/transforms/functional.py", "torchvision/transforms/v2/__init__.py",
             "torchvision/transforms/v2/functional.py"):
    _path = os.path.join(_stub_root, _rel)
    os.makedirs(os.path.dirname(_path), exist_ok=True)
    with open(_path, "w") as _f:
        _f.write(_body)
sys.path.insert(0, _stub_root)
os.environ["PYTHONPATH"] = _stub_root
"""


def oracle_python() -> Path | None:
    named = os.environ.get("VLLM_FLEET_ORACLE_PYTHON")
    if named:
        return Path(named)
    for venv in sorted(CACHE.glob("oracle-*")):
        if (venv / ".complete").exists():
            return venv / "bin" / "python"
    return None


@pytest.fixture(scope="session")
def oracle() -> OracleRun:
    """``oracle(code, data)`` runs ``code`` in vLLM's interpreter with ``DATA`` (the JSON of
    ``data``) bound, and returns the JSON the code assigned to ``RESULT``."""
    python = oracle_python()
    if python is None or not python.exists():
        if os.environ.get("VLLM_FLEET_ORACLE_REQUIRED") == "1":
            pytest.fail("no vLLM oracle: run `python -m tests.hosts oracle` or set VLLM_FLEET_ORACLE_PYTHON")
        pytest.skip("no vLLM oracle interpreter (python -m tests.hosts oracle builds one)")

    def run(code: str, data: Any = None) -> Any:
        script = (
            "import json, sys\n"
            "DATA = json.loads(sys.stdin.read())\n"
            + textwrap.dedent(code)
            + "\nsys.stdout.write('\\n@@ORACLE@@' + json.dumps(RESULT))\n"
        )
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH="")
        done = subprocess.run(
            [str(python), "-c", script],
            input=json.dumps(data),
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or "@@ORACLE@@" not in done.stdout:
            raise AssertionError(f"oracle failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.rsplit("@@ORACLE@@", 1)[1])

    return run
