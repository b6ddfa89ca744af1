"""What the adapter tests share: the tiny model's fixture adapters (scripts/make_tiny_lora.py), the CLI as a user runs
it, and a new revision of an adapter made by editing its adapter_config.json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.paths import CONFIGS, REPO, TINY_MODEL

ADAPTERS = TINY_MODEL.parent / "adapters"


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def set_dropout(folder: Path, dropout: float) -> None:
    """Another revision of the adapter in `folder`: its adapter_config.json's `lora_dropout` (merging ignores it)."""
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "lora_dropout": dropout}, indent=2))


@dataclass(frozen=True)
class TwoAdapterRun:
    """configs/tiny-lora.yaml with two adapters (`plus-one` and `retrained`, a copy of it under another revision's
    adapter_config.json: the same weights, its own unit, key, alias and lineage), benchmark off, against a file://
    store and MLflow on SQLite in `tmp`: the spec, the CLI's environment, the MLflow URI and the retrained folder."""

    spec: Path
    env: dict[str, str]
    mlflow_uri: str
    retrained: Path


def two_adapter_run(tmp: Path, mode: str = "merge") -> TwoAdapterRun:
    retrained = tmp / "retrained"
    shutil.copytree(ADAPTERS / "plus-one", retrained)
    set_dropout(retrained, 0.05)
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["benchmark"]["enabled"] = False
    data["model"]["source"] = str(TINY_MODEL)
    if mode != "merge":
        data["model"]["adapter_mode"] = mode
    data["model"]["adapters"] = [{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                                 {"name": "retrained", "source": str(retrained)}]
    data["smoke"]["prompts"] = str(CONFIGS / "prompts" / "tiny-chat.jsonl")
    spec = tmp / ("tiny-lora.yaml" if mode == "merge" else f"tiny-lora-{mode}.yaml")
    spec.write_text(yaml.safe_dump(data))
    mlflow_uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {**os.environ, "EF_STORE": f"file://{tmp / 'store'}", "MLFLOW_TRACKING_URI": mlflow_uri,
           "EF_CACHE_DIR": str(tmp / "cache"), "EF_WORK_DIR": str(tmp / "work"),
           "EF_REFERENCE_CACHE": str(tmp / "refs"), "PREFECT_HOME": str(tmp / "prefect"),
           "HF_HOME": str(tmp / "hf"), "OMP_NUM_THREADS": "1"}
    return TwoAdapterRun(spec=spec, env=env, mlflow_uri=mlflow_uri, retrained=retrained)
