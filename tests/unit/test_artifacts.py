"""Keys, the manifest schema, leases, explain and lineage (file:// store, local MLflow)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from enginefoundry.identity import canonical_json, sha256_file
from enginefoundry.inputs.units import SourceDigests, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.planning.explain import diff_components
from enginefoundry.spec import load_spec
from enginefoundry.store.manifest import SCHEMA_PATH, Manifest, generated_schema, validate_against_schema
from tests.support.paths import REPO


def test_committed_schema_is_the_generated_one():
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(generated_schema()))


def test_invalid_manifest_is_refused_by_the_schema():
    good = Manifest(key="k", key_components={}, model="m", unit="u", lane="reference", target={}, variant={},
                    profile={}, source={}, files=[{"path": "a", "size": 1, "sha256": "0" * 64}], status="candidate")
    data = json.loads(good.to_json())
    validate_against_schema(data)
    data["files"][0]["size"] = "big"
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(data)
    del data["key"]
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(data)


def test_unit_key_is_canonical_and_names_every_component():
    spec = load_spec(REPO / "configs" / "llama-3.1-8b-multiarch.yaml")
    units = expand_units(spec)
    tc = toolchain_identity(spec, {"tensorrt_llm": "1.2.1"})
    comps = [unit_key_components(spec, u, SourceDigests(weights="w" * 64, tokenizer="t" * 64), tc, spec.lane_options)
             for u in units]
    keys = [key_of(c) for c in comps]
    assert len(set(keys)) == len(keys)  # every unit has its own key
    assert set(comps[0]) == {"format_version", "kind", "weights_digest", "tokenizer_digest", "lane", "toolchain",
                             "variant", "profile", "target", "calibration", "lane_options"}
    # No paths, clocks or credentials; order-independent.
    assert "/" not in canonical_json({k: v for k, v in comps[0].items() if k != "toolchain"})
    assert key_of(dict(reversed(list(comps[0].items())))) == keys[0]
    h100 = next(c for c, u in zip(comps, units, strict=True) if u.target.name == "h100")
    assert h100["target"] == {"arch": "sm90", "sku": ["gh200", "h100", "h200"], "gpu_count": 1}


def test_diff_names_the_changed_component():
    old = {"profile": {"max_batch_size": 4}, "weights_digest": "a"}
    new = {"profile": {"max_batch_size": 8}, "weights_digest": "a"}
    assert diff_components(old, new) == ["profile.max_batch_size: 4 → 8"]


def test_sha256_streams_large_files(tmp_path: Path):
    f = tmp_path / "big"
    with f.open("wb") as out:
        for _ in range(3):
            out.write(b"x" * (8 * 1024 * 1024 + 3))
    import hashlib

    assert sha256_file(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_best_profile_per_target_is_chosen_on_slo_throughput():
    from enginefoundry.records.run_summary import UnitOutcome, best_profiles

    def unit(name: str, slo: list[dict], status: str = "candidate") -> UnitOutcome:
        return UnitOutcome(unit=name, target=name.split(".")[2], status=status, bench={"slo": slo})

    rows = best_profiles([
        unit("bf16-tp1.short.h100", [{"best_concurrency": 64, "output_tokens_per_s": 9000.0}]),
        unit("bf16-tp1.long.h100", [{"best_concurrency": 32, "output_tokens_per_s": 7000.0}]),
        unit("bf16-tp1.turbo.h100", [{"best_concurrency": 128, "output_tokens_per_s": 99999.0}], "rejected"),
        unit("bf16-tp1.short.a100", [{"best_concurrency": None, "output_tokens_per_s": None}]),
    ])
    by_target = {r["target"]: r for r in rows}
    assert by_target["h100"]["best profile"] == "short" and by_target["h100"]["at concurrency"] == "64"
    assert by_target["a100"]["best profile"] == "none"
