"""One declaration per option (vllm_fleet/schema.py): an option added in that one place is an
inventory variable, a CLI flag, an accepted wish and a rendered vllm serve argument; the
rendering rules of the declared options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from vllm_fleet import schema
from vllm_fleet.accounting.settings import Settings
from vllm_fleet.cli import build_parser
from vllm_fleet.inventory import interface
from vllm_fleet.planning.strategy import Wishes

# The one line a contributor adds (vLLM's --seed: no memory of its own).
NEW_OPTION = '    seed: int | None = opt(None, "--seed", "random seed of the sampler", minimum=0, maximum=2**31)\n'
ANCHOR = "    # The vLLM release that runs (image tag, venv pin, the accounting).\n"

PROBE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from vllm_fleet.inventory import interface
from vllm_fleet.cli import main
import vllm_fleet as _pkg
assert _pkg.__file__.startswith(sys.argv[1]), _pkg.__file__
from importlib import util
spec = util.spec_from_file_location("fleet_filter", Path(sys.argv[1]) / "plugins/filter/vllm_fleet_plan.py")
filt = util.module_from_spec(spec); spec.loader.exec_module(filt)
out = {}
out["variable"] = interface.resolve({"vllm_fleet_model": "m", "vllm_fleet_seed": "7"})["seed"]
out["wishes"] = interface.wishes(interface.resolve({"vllm_fleet_model": "m", "vllm_fleet_seed": 7})).get("seed")
out["readme"] = any("vllm_fleet_seed" in row for row in interface.markdown_rows())
try:
    interface.resolve({"vllm_fleet_model": "m", "vllm_fleet_seed": "-1"})
except Exception as err:
    out["refused"] = str(err)
nodes = [{"name": "n1", "gpu": "H100", "gpu_count": 1}]
plan = filt.vllm_fleet_plan(nodes, "Qwen/Qwen3-8B", {"seed": "7"})
out["filter_args"] = plan["instances"][0]["vllm_args"]
print(json.dumps(out))
"""


def test_an_option_added_in_one_place_is_a_variable_a_flag_a_wish_and_an_argument(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "vllm_fleet", copy / "vllm_fleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "plugins", copy / "plugins", ignore=shutil.ignore_patterns("__pycache__"))
    declared = copy / "vllm_fleet" / "schema.py"
    text = declared.read_text()
    assert text.count(ANCHOR) == 1
    declared.write_text(text.replace(ANCHOR, NEW_OPTION + ANCHOR))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(copy)],
        capture_output=True,
        text=True,
        env=env,
        cwd=copy,
        check=False,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout)
    assert found["variable"] == 7 and found["wishes"] == 7 and found["readme"]
    assert "vllm_fleet_seed: -1 is below 0" in found["refused"]
    args = found["filter_args"]
    assert args[args.index("--seed") + 1] == "7", args
    # The CLI flag, planned and rendered.
    cli = [sys.executable, "-m", "vllm_fleet.cli", "plan", "--model", "Qwen/Qwen3-8B", "--cluster"]
    cli += [str(FIXTURES / "2x8xa800.yml"), "--seed", "11", "--json"]
    done = subprocess.run(cli, capture_output=True, text=True, env=env, cwd=copy, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    argv = json.loads(done.stdout)["instances"][0]["vllm_args"]
    assert argv[argv.index("--seed") + 1] == "11", argv
    # And the checkout itself does not have it (the copy was changed, not this tree).
    assert "seed" not in schema.by_name()


def test_every_declared_option_is_a_variable_a_flag_and_a_wish() -> None:
    flags = vars(build_parser().parse_args(["plan", "--model", "m", "--cluster", "c.yml"]))
    for d in schema.declared():
        assert interface.BY_NAME[d.inventory].default == d.default, d.name
        assert d.name in Wishes.__dataclass_fields__, d.name
        if "plan" in d.option.commands:
            assert d.name in flags, d.name
    # Settings (what the memory model reads) holds every serving option.
    assert set(schema.serving_names()) <= {f.name for f in fields(Settings)}


@pytest.mark.parametrize(
    ("options", "multimodal", "expected"),
    [
        ({}, False, []),
        ({"enforce_eager": True, "kv_cache_dtype": "fp8"}, False, ["--kv-cache-dtype", "fp8", "--enforce-eager"]),
        # LoRA's own options only with --enable-lora; rank and slots then at their defaults too.
        ({"max_loras": 4, "lora_dtype": "float16"}, False, []),
        ({"enable_lora": True}, False, ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "16"]),
        # The multimodal ones for a multimodal model only.
        ({"skip_mm_profiling": True, "mm_max_pixels": 1000}, False, []),
        (
            {"skip_mm_profiling": True, "mm_max_pixels": 1000},
            True,
            ["--mm-processor-kwargs", '{"max_pixels":1000}', "--skip-mm-profiling"],
        ),
        # A boolean whose unset is vLLM's default: on, off, or nothing.
        ({"enable_prefix_caching": False}, False, ["--no-enable-prefix-caching"]),
        ({"enable_prefix_caching": None}, False, []),
        (
            {"speculative_config": {"num_speculative_tokens": 3, "method": "ngram"}, "cpu_offload_gb": 2.5},
            False,
            ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}', "--cpu-offload-gb", "2.5"],
        ),
        # The planner renders the layout, the context length and the dtype it chose, not these.
        ({"tensor_parallel_size": 2, "max_model_len": 4096, "dtype": "float16"}, False, []),
    ],
)
def test_serve_args_render_the_declared_options(
    options: dict[str, object], multimodal: bool, expected: list[str]
) -> None:
    assert schema.serve_args(Settings(**options), multimodal) == expected  # type: ignore[arg-type]


def test_a_json_option_from_the_inventory_is_a_mapping_or_its_json_text() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert interface.coerce("speculative_config", spec) == spec
    assert interface.coerce("speculative_config", json.dumps(spec)) == spec
    with pytest.raises(ValueError, match="vllm_fleet_speculative_config: 'ngram' is neither a mapping nor JSON"):
        interface.coerce("speculative_config", "ngram")
    with pytest.raises(ValueError, match="vllm_fleet_max_lora_rank: 12 is not one of 1, 8, 16"):
        interface.coerce("max_lora_rank", "12")
