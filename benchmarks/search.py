"""Time the search itself: predict for 3 targets (H100, H200, B200) × 4 precisions (bf16, fp8, nvfp4, int8_wo) on
the Llama-3.1-8B config, uncached (an empty cache) then cached. Needs `make predict-venv`.

    python benchmarks/search.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml

from enginefoundry.search.plan import materialise
from enginefoundry.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]


def spec():
    data = yaml.safe_load((REPO / "configs" / "llama-3.1-8b-search.yaml").read_text())
    data["targets"].append({"name": "b200", "arch": "sm100", "sku": ["B200"], "gpu_count": 8})
    data["search"]["precisions"] = ["bf16", "fp8", "nvfp4", "int8_wo"]
    return parse_spec(data, base_dir=REPO / "configs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="cached rounds after the uncached one")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["EF_CACHE_DIR"] = cache
        rows = []
        for i in range(1 + args.rounds):
            t0 = time.monotonic()
            _, report = materialise(spec(), progress=lambda _: None)
            wall = time.monotonic() - t0
            rows.append({"round": i, "cached": i > 0, "wall_s": round(wall, 2),
                         "answers": {t.target: {"units": t.units, "no_answer": t.problems} for t in report.targets}})
            print(f"round {i} ({'cached' if i else 'uncached'}): {wall:.1f} s", flush=True)
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
