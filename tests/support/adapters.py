"""What the adapter tests share: the tiny model's fixture adapters (scripts/make_tiny_lora.py), the CLI as a user runs
it, and a new revision of an adapter made by editing its adapter_config.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO, TINY_MODEL

ADAPTERS = TINY_MODEL.parent / "adapters"


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def set_dropout(folder: Path, dropout: float) -> None:
    """Another revision of the adapter in `folder`: its adapter_config.json's `lora_dropout` (merging ignores it)."""
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "lora_dropout": dropout}, indent=2))
