"""Config.json values of the models operators deploy in 2026: data in
``vllm_fleet/model/catalog_2026.yaml``, each model with a comment saying where its values were read
(the copy, and which values were not verified from it). ``catalog.MODELS`` merges them in.

Pure Python and PyYAML (libyaml's loader where it is built in: about 4 ms).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "catalog_2026.yaml"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    data = yaml.load(DATA.read_text(encoding="utf-8"), Loader=_LOADER)  # a safe loader
    return dict(data["models"]), dict(data["aliases"])


# Catalog name -> config.json; names for the same weights whose config.json was not read on its own.
MODELS_2026, ALIASES_2026 = _load()
