"""`smoke.reference: sibling`: validation names the field and the fix; the precision order is the gate's."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.smoke.policy import FAMILY_OF, PrecisionFamily
from enginefoundry.spec import Precision, parse_spec
from enginefoundry.spec.siblings import higher_precision_variants, named_sibling, sibling_variant
from tests.support.paths import CONFIGS


def _spec(variants: list[dict[str, Any]], targets: list[dict[str, Any]] | None = None, **smoke: Any):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = variants
    if targets is not None:
        data["targets"] = targets
    data["smoke"].update(smoke)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _problems(*args: Any, **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        _spec(*args, **kw)
    return err.value.problems


def test_precision_rank_follows_the_gate_families():
    order = [PrecisionFamily.FOUR, PrecisionFamily.EIGHT, PrecisionFamily.HALF, PrecisionFamily.FULL]
    for p in Precision:
        assert p.rank == order.index(FAMILY_OF[p.value]), p


def test_a_sibling_judges_only_lower_precision_variants():
    spec = _spec([{"precision": "fp32"}, {"precision": "bf16"}, {"precision": "fp16"}],
                 reference="sibling", reference_sibling="fp32")
    fp32, bf16, fp16 = spec.variants
    assert named_sibling(spec) is fp32
    assert sibling_variant(spec, fp32) is None  # the sibling itself is judged against the source
    assert sibling_variant(spec, bf16) is fp32 and sibling_variant(spec, fp16) is fp32
    same_family = _spec([{"precision": "bf16"}, {"precision": "fp16"}, {"precision": "fp8"}],
                        reference="sibling", reference_sibling="bf16")
    assert sibling_variant(same_family, same_family.variants[1]) is None  # fp16 is not below bf16
    assert sibling_variant(same_family, same_family.variants[2]).name == "bf16-tp1"


def test_source_is_the_default_and_sibling_needs_its_name():
    assert named_sibling(_spec([{"precision": "fp32"}, {"precision": "bf16"}])) is None
    [(field, msg)] = _problems([{"precision": "fp32"}], reference="sibling")
    assert field == "smoke" and "needs smoke.reference_sibling" in msg and "reference_sibling: bf16" in msg
    [(field, msg)] = _problems([{"precision": "fp32"}], reference_sibling="fp32")
    assert "set reference: sibling" in msg


def test_a_sibling_missing_from_the_variants_is_refused_with_the_fix():
    [(field, msg)] = _problems([{"precision": "bf16"}, {"precision": "fp16"}], reference="sibling",
                               reference_sibling="fp32")
    assert field == "smoke.reference_sibling"
    assert "'fp32' is not a variant of this spec (variants: bf16-tp1, fp16-tp1)" in msg
    assert "smoke.reference: source" in msg


def test_a_sibling_that_is_not_more_precise_than_any_unit_is_refused():
    [(field, msg)] = _problems([{"precision": "bf16"}, {"precision": "fp16"}], reference="sibling",
                               reference_sibling="fp16")
    assert field == "smoke.reference_sibling" and "not of higher precision than any other variant" in msg


def test_an_ambiguous_precision_must_name_the_variant():
    variants = [{"precision": "fp32"}, {"precision": "fp32", "tp": 2}, {"precision": "bf16"}]
    [(_, msg)] = _problems(variants, reference="sibling", reference_sibling="fp32")
    assert "names 2 variants (fp32-tp1, fp32-tp2): name one of them" in msg
    spec = _spec(variants, reference="sibling", reference_sibling="fp32-tp2")
    assert sibling_variant(spec, spec.variants[2]).name == "fp32-tp2"


def test_a_judged_variant_on_a_target_without_its_sibling_is_refused():
    targets = [{"name": "cpu", "arch": "cpu", "gpu_count": 0}, {"name": "cpu2", "arch": "cpu", "gpu_count": 0}]
    [(field, msg)] = _problems([{"precision": "fp32", "targets": ["cpu"]}, {"precision": "bf16"}], targets,
                               reference="sibling", reference_sibling="fp32")
    assert field == "smoke.reference_sibling"
    assert "variant bf16-tp1 is built for targets ['cpu2'] where its sibling fp32-tp1 is not" in msg


def test_higher_precision_variants_are_those_on_the_target_best_first():
    targets = [{"name": "cpu", "arch": "cpu", "gpu_count": 0}, {"name": "cpu2", "arch": "cpu", "gpu_count": 0}]
    spec = _spec([{"precision": "bf16"}, {"precision": "fp32", "targets": ["cpu2"]}, {"precision": "fp8"}],
                 targets)
    fp8 = spec.variants[2]
    assert [v.name for v in higher_precision_variants(spec, fp8, "cpu2")] == ["fp32-tp1", "bf16-tp1"]
    assert [v.name for v in higher_precision_variants(spec, fp8, "cpu")] == ["bf16-tp1"]
