"""The whole plan matrix against each fake release (tests/fixtures/fake-trtllm): every precision × tp × pp × KV
dtype × architecture × lane. Every unit is either refused before it runs (spec validation or preflight) or its
commands, YAML keys and template keys are all accepted by that release: zero unknown flags."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.inputs.toolchain import ToolSurface, UnsupportedByRelease, check_against_surface
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.trtllm_flags import unsupported_env
from enginefoundry.planning.preflight import preflight
from enginefoundry.spec import KVCacheDtype, Precision, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
LLAMA_8B = json.loads((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())
ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100")
TPS = (1, 2, 4, 8)
PPS = (1, 2)
VERSIONS = {"1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1", "1.3": "1.3.0rc20", "1.4": "1.4.0rc4"}


def lanes_for(release: str) -> tuple[str, ...]:
    """The lanes a release can run: 1.3 removed the engine path (the engine lane refuses it: test_trtllm_13)."""
    return ("trtllm",) if release in ("1.3", "1.4") else ("trtllm", "trtllm-engine")


def matrix_spec(lane: str, version: str):
    config = "llama-3-70b-tp2-a100.yaml" if lane == "trtllm-engine" else "llama-3.1-8b-multiarch.yaml"
    data = yaml.safe_load((CONFIGS / config).read_text())
    data["model"] = {"source": "hf://meta-llama/Llama-3.1-8B-Instruct@main", "name": "llama-3.1-8b-instruct"}
    data["toolchain"] = {"trtllm_version": version}
    data["lane_options"] = {"gemm_plugin": "auto"} if lane == "trtllm-engine" else {}
    data["variants"] = [{"precision": p.value, "tp": tp, "pp": pp, "kv_cache_dtype": kv.value}
                        for p, tp, pp, kv in itertools.product(Precision, TPS, PPS, KVCacheDtype)]
    data["targets"] = [{"name": arch, "arch": arch, "sku": [], "gpu_count": 16, "memory_gib": 80} for arch in ARCHS]
    data["profiles"] = data["profiles"][:1]
    return parse_spec(data, base_dir=CONFIGS)


@pytest.mark.parametrize("release", list(VERSIONS))
def test_every_unit_is_accepted_or_refused_before_it_runs(fake_trtllm, release):
    surface = ToolSurface.model_validate(fake_trtllm.expected_surface(release))
    counts = {"units": 0, "refused_by_spec": 0, "refused_by_preflight": 0, "accepted": 0, "flags_checked": 0}
    for lane_name in lanes_for(release):
        spec = matrix_spec(lane_name, VERSIONS[release])
        lane = get_lane(lane_name)
        refused_variants = {int(path.split(".")[1]) for path, _ in lane.validate_options(spec)
                            if path.startswith("variants.")}
        lane_wide = [p for p in lane.validate_options(spec) if not p[0].startswith("variants.")]
        assert lane_wide == [], lane_wide
        index = {v.name: i for i, v in enumerate(spec.variants)}
        for unit in expand_units(spec):
            counts["units"] += 1
            if index[unit.variant.name] in refused_variants:
                counts["refused_by_spec"] += 1
                continue
            if not preflight(spec, unit, LLAMA_8B, None).ok:
                counts["refused_by_preflight"] += 1
                continue
            for rendered in (lane.describe(spec, unit, surface), lane.describe(spec, unit)):  # worker, and `plan`
                try:
                    check_against_surface(rendered, surface)
                except UnsupportedByRelease as err:  # an emitted flag the release lacks: the bug this test catches
                    pytest.fail(f"{release} {unit.name} ({lane_name}): {err}")
                assert unsupported_env(rendered, surface.tensorrt_llm) == [], unit.name
                counts["flags_checked"] += sum(a.startswith("--") for c in rendered for a in c.argv)
            counts["accepted"] += 1
    per_lane = len(Precision) * len(TPS) * len(PPS) * len(KVCacheDtype) * len(ARCHS)
    assert counts["units"] == len(lanes_for(release)) * per_lane
    assert counts["accepted"] > 0 and counts["refused_by_spec"] > 0 and counts["refused_by_preflight"] > 0
    assert counts["units"] == counts["accepted"] + counts["refused_by_spec"] + counts["refused_by_preflight"]
    print(release, counts)


def test_the_committed_fakes_are_the_generated_ones(tmp_path, fake_trtllm):
    import importlib.util

    here = fake_trtllm.release_dir("1.0").parent
    spec = importlib.util.spec_from_file_location("fake_generate", here / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    generate.generate(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made, "generate.py wrote nothing"
    for rel in made:
        assert (here / rel).read_text() == (tmp_path / rel).read_text(), f"{rel}: run generate.py"
    for release in fake_trtllm.RELEASES:
        data = json.loads((here / release / "surface.json").read_text())
        assert all(tool["source"] for tool in data["tools"].values())  # each fixture says where it came from
        assert data["llm_api"]["source"] and data["triton_templates"]["source"] and data["modelopt_source"]
