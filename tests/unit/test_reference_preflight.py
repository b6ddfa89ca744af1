"""Preflight refuses, from config.json alone (before any download), a smoke reference that fits nowhere allowed."""

from __future__ import annotations

from enginefoundry.inputs.units import expand_units
from enginefoundry.planning.preflight import GIB, preflight
from enginefoundry.spec import load_spec
from tests.support.paths import REPO

LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def _spec(**smoke):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    return spec.model_copy(update={"smoke": spec.smoke.model_copy(update=smoke)})


def _check(spec, **kw):
    report = preflight(spec, expand_units(spec)[0], LLAMA_70B, None, **kw)
    return next(c for c in report.checks if c.name == "reference_memory"), report


def test_a_70b_fp32_reference_is_refused_where_the_spec_allows_64_gib_with_the_fix():
    check, report = _check(_spec(reference_host_memory_gib=64, reference_precision="fp32"))
    assert not check.ok and check in report.problems
    assert check.message.startswith("the fp32 smoke reference needs ≈")
    assert "smoke.reference_host_memory_gib allows 64.0 GiB" in check.message
    assert "a larger reference host" in check.fix and "already published" in check.fix


def test_bf16_is_proposed_when_it_fits():
    check, _ = _check(_spec(reference_host_memory_gib=200))  # fp32 ≈ 316 GiB, bf16 ≈ 158 GiB
    assert not check.ok and check.fix.startswith("smoke.reference_precision: bf16 (≈")
    ok, _ = _check(_spec(reference_host_memory_gib=200, reference_precision="bf16"))
    assert ok.ok


def test_without_a_spec_limit_this_host_only_informs_off_the_worker():
    check, _ = _check(_spec(), host_memory=16 * GIB)
    assert check.ok and "this host has 16.0 GiB" in check.message
