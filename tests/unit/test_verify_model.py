"""model_cache's on-node verification script (pure Python)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT, load_script, write_safetensors


def _verify() -> ModuleType:
    return load_script(ROOT / "roles/model_cache/files/verify_model.py")


def _model(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_safetensors(folder / "model-00001-of-00002.safetensors", {"a": ("BF16", [8, 8])})
    write_safetensors(folder / "model-00002-of-00002.safetensors", {"b": ("F32", [4, 4])})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    return folder


def test_a_whole_model_passes(tmp_path: Path) -> None:
    result = _verify().check(_model(tmp_path / "m"))
    assert result["problems"] == [] and result["files"] == 4


def test_truncated_missing_and_broken_files_are_named(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m")
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    (folder / "model-00002-of-00002.safetensors").unlink()
    (folder / "config.json").write_text("{not json")
    problems = _verify().check(folder)["problems"]
    assert any(p.startswith("model-00001-of-00002.safetensors:") and "truncated" in p for p in problems)
    assert "model-00002-of-00002.safetensors: listed in the index but missing" in problems
    assert any(p.startswith("config.json:") for p in problems)


def _space() -> ModuleType:
    return load_script(ROOT / "roles/model_cache/files/space.py")


def test_space_counts_what_is_already_there(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    whole = _space().check(folder, size)
    assert whole["present"] == size and whole["needed"] == 0 and whole["fits"] is True
    (folder / "model-00002-of-00002.safetensors").unlink()
    part = _space().check(folder, size)
    assert 0 < part["needed"] < size and part["needed"] == size - part["present"]


def test_space_of_a_folder_not_made_yet_is_its_filesystem_s(tmp_path: Path) -> None:
    result = _space().check(tmp_path / "not" / "yet", 1 << 60)
    assert result["present"] == 0 and result["needed"] == 1 << 60 and result["fits"] is False
    assert result["free"] > 0
