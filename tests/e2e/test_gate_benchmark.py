"""CI's reduced gate benchmark: a real pretrained chat model from PyPI, its bf16 build and three broken builds,
each served by the reference lane's scoring server (benchmarks/gate.py --server ef, the default) and judged by
`enginefoundry smoke` at default settings but --reference-precision unit (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


@pytest.mark.e2e
def test_reduced_gate_benchmark_has_no_false_rejects_and_no_false_accepts(tmp_path: Path):
    out = tmp_path / "gate.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gate.py"), "--reduced", "--jobs", "2",
                           "--json-out", str(out)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["build"], r["verdict"]) for r in rows] == [
        ("bf16", "pass"), ("wrong-chat-template", "reject"), ("layer-zeroed", "reject"),
        ("lm-head-permuted", "reject")]
    assert all(r["model"] == "smollm2-135m" and r["prompts"] == 48 for r in rows)
    assert "false rejects: 0/1 healthy builds (0%); false accepts: 0/3 broken builds (0%)" in done.stdout
