"""On a GPU host (the lent H200): measured tokens/joule and $/1M output tokens for the reference lane's tiny model at
two batch settings, with the pipeline's own energy code (enginefoundry.bench.costs.energy_mj: NVML's energy
counter) and cost code (enginefoundry.bench.costs.unit_cost).
Prints what it finds first (torch, CUDA, NVML, transformers,
AIPerf) and says what it cannot do; writes JSON to --out.

    PYTHONPATH=. python benchmarks/search_gpu.py --out search-gpu.json [--batches 1 32] [--new-tokens 200]

It needs torch with CUDA, transformers, PyYAML and pydantic (enginefoundry.spec). The lent H200 image has all but
pydantic (seen 2026-12-01: /opt/torch/.venv Python 3.12.3, torch 2.11.0+cu130, CUDA available, transformers, yaml,
pynvml; no pydantic, no AIPerf, pip without an index). Carry the bundle: `make gpu-bundle` here (→ .gpu-bundle/, for
CPython 3.12), then on the GPU host:

    python3 scripts/gpu_install.py --into /tmp/ef-site
    PYTHONPATH=.:/tmp/ef-site python3 benchmarks/search_gpu.py --out search-gpu.json --batches 1 32

The whole pipeline on that host (serve, gate, AIPerf, publish, MLflow) is scripts/gpu_run.sh.

This measures generation in-process (transformers `generate`, greedy, fixed output length) rather than through
`transformers serve` + AIPerf, because the GPU host has no AIPerf; cost and energy use the pipeline's own code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL = REPO / "tests" / "fixtures" / "tiny-chat" / "model"


def inventory() -> dict[str, Any]:
    found: dict[str, Any] = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "pynvml", "aiperf"):
        found[mod] = importlib.util.find_spec(mod) is not None
    found["aiperf_cli"] = shutil.which("aiperf")
    if found["torch"]:
        import torch

        found["torch_version"] = torch.__version__
        found["cuda"] = torch.cuda.is_available()
        found["gpu"] = torch.cuda.get_device_name(0) if found["cuda"] else None
    from enginefoundry.bench.costs import energy_mj

    found["nvml_energy_mj"] = energy_mj([0])
    return found


def measure(batch: int, new_tokens: int, rounds: int) -> dict:
    """Greedy generation of `new_tokens` for `batch` prompts, `rounds` times, on cuda:0; energy over the window."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from enginefoundry.bench.costs import energy_mj

    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).to("cuda:0").eval()  # type: ignore[arg-type]  # transformers 5.24 types `.to` loosely
    prompts = ["Tell me about the weather today."] * batch
    enc = tok(prompts, return_tensors="pt").to("cuda:0")  # one prompt repeated: no padding
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=8, min_new_tokens=8, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        e0, t0 = energy_mj([0]), time.monotonic()
        for _ in range(rounds):
            out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
        t1, e1 = time.monotonic(), energy_mj([0])
    tokens = (out.shape[1] - enc["input_ids"].shape[1]) * batch * rounds
    joules = (e1 - e0) / 1000.0 if e0 is not None and e1 is not None else None
    return {"batch": batch, "output_tokens": tokens, "window_s": round(t1 - t0, 3),
            "output_tokens_per_s": tokens / (t1 - t0), "energy_j": joules}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="search-gpu.json")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--new-tokens", type=int, default=200, help="the tiny model has 256 positions")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    found = inventory()
    print(json.dumps(found, indent=1), flush=True)
    result: dict[str, Any] = {"inventory": found, "points": []}
    if not (found["torch"] and found.get("cuda") and found["transformers"]):
        print("cannot measure: needs torch with CUDA and transformers (pip install -e '.[reference]')")
    else:
        from enginefoundry.bench.costs import unit_cost
        from enginefoundry.spec import Arch, Target, load_spec

        spec = load_spec(REPO / "configs" / "tiny-search.yaml")
        h200 = Target(name="h200", arch=Arch("sm90"), sku=[found["gpu"] or "H200"], gpu_count=1)
        for batch in args.batches:
            m = measure(batch, args.new_tokens, args.rounds)
            cost = unit_cost(spec, h200, m["output_tokens_per_s"], energy_j=m["energy_j"], window_s=m["window_s"],
                             output_tokens=m["output_tokens"])
            m.update(cost.summary())
            result["points"].append(m)
            print(json.dumps(m), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
