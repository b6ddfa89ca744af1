#!/usr/bin/env python3
"""Run the reference lane's build, serve and smoke for a GPU target through enginefoundry/ alone (no
Prefect), with the target matched against the GPU this machine actually has.

    python scripts/gpu_unit.py configs/tiny-sm90.yaml [--out DIR]

Prints one JSON line per unit (device facts, timings, smoke verdict) and writes them to DIR/gpu_unit.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from enginefoundry.gpu.detect import detect_gpus, match_target
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.reference import ReferenceLane
from enginefoundry.model_server import free_port, serving
from enginefoundry.planning.plan_report import model_config_for
from enginefoundry.planning.preflight import preflight
from enginefoundry.smoke import SmokeInputs, load_prompt_set, run_smoke
from enginefoundry.spec import load_spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    gpus = detect_gpus()
    print(json.dumps({"detected": [g.model_dump() for g in gpus]}), flush=True)
    lane = ReferenceLane()
    source_dir = Path(spec.model.parsed_source(spec.base_path).location)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ef-gpu-") as tmp:
        for unit in expand_units(spec):
            matched = match_target(unit.target, gpus)  # refuses a unit for another architecture or SKU
            report = preflight(spec, unit, model_config_for(spec), gpus)
            report.raise_for_problems()
            work = Path(tmp) / unit.name
            work.mkdir()
            t0 = time.monotonic()
            ckpt = lane.convert(spec, unit.variant, source_dir, work)
            t1 = time.monotonic()
            build = lane.build(spec, unit, Path(ckpt.checkpoint_dir), work)
            t2 = time.monotonic()
            # The server the pipeline's smoke stage judges (the reference lane: its scoring server, with log-probs).
            cmd = lane.smoke_serve_command(Path(build.bundle_dir), "127.0.0.1", free_port(), spec.model.name,
                                           spec.lane_options)
            with serving(cmd, work / "server.log") as endpoint:
                t3 = time.monotonic()
                smoke = run_smoke(SmokeInputs(spec.smoke, load_prompt_set(spec.resolve_path(spec.smoke.prompts)),
                                  reference_dir=source_dir,
                                  base_url=endpoint.base_url, model_name=endpoint.model_name,
                                  served_tokenizer_dir=Path(endpoint.tokenizer_dir), progress=lambda _: None,
                                  precision=unit.variant.precision.value))
            t4 = time.monotonic()
            result = {
                "unit": unit.name, "matched_gpu": matched[0].name, "arch": matched[0].arch,
                "device": build.device, "preflight_ok": report.ok,
                "seconds": {"convert": round(t1 - t0, 2), "build": round(t2 - t1, 2),
                            "serve_start": endpoint.startup_s, "smoke": round(t4 - t3, 2)},
                "smoke": smoke.summary(), "verdict": smoke.verdict.reason, "server": endpoint.server,
            }
            results.append(result)
            print(json.dumps(result), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_unit.json").write_text(json.dumps(results, indent=2))
    return 0 if all(r["smoke"]["smoke_passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
