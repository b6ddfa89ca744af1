"""Sibling references: which variant's served answers judge which lower-precision variant (`smoke.reference:
sibling`, `smoke.reference_sibling`), and the spec problems that make such a plan impossible.

A unit judged against a sibling is compared with the greedy answers its sibling unit (same source, target and
profile; the named, higher-precision variant) served on the same prompts, instead of with the Hugging Face
source: the bf16 unit of a 70B model judges its fp8 unit without a 280 GB fp32 reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry.spec.checks import ReferenceSource
from enginefoundry.spec.matrix import Variant

if TYPE_CHECKING:
    from enginefoundry.spec.build_spec import BuildSpec

FIELD = "smoke.reference_sibling"


def named_sibling(spec: BuildSpec) -> Variant | None:
    """The variant `smoke.reference_sibling` names (a variant name, or a precision only one variant has)."""
    if spec.smoke.reference is not ReferenceSource.SIBLING or not spec.smoke.reference_sibling:
        return None
    wanted = spec.smoke.reference_sibling
    by_name = [v for v in spec.variants if v.name == wanted]
    if by_name:
        return by_name[0]
    by_precision = [v for v in spec.variants if v.precision.value == wanted]
    return by_precision[0] if len(by_precision) == 1 else None


def on_target(variant: Variant, target: str) -> bool:
    return variant.targets is None or target in variant.targets


def sibling_variant(spec: BuildSpec, variant: Variant) -> Variant | None:
    """The variant whose served answers judge `variant`; None when it is judged against the source (sibling
    references off, or `variant` is not of lower precision than the sibling)."""
    sibling = named_sibling(spec)
    if sibling is None or variant.precision.rank >= sibling.precision.rank:
        return None
    return sibling


def higher_precision_variants(spec: BuildSpec, variant: Variant, target: str) -> list[Variant]:
    """Variants of the spec on `target` that could judge `variant` (strictly higher precision), best first."""
    found = [v for v in spec.variants if v.precision.rank > variant.precision.rank and on_target(v, target)]
    return sorted(found, key=lambda v: -v.precision.rank)


def sibling_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """What makes `smoke.reference: sibling` impossible, as (field, message with the fix)."""
    if spec.smoke.reference is not ReferenceSource.SIBLING or not spec.smoke.reference_sibling:
        return []
    wanted = spec.smoke.reference_sibling
    names = [v.name for v in spec.variants]
    sibling = named_sibling(spec)
    if sibling is None:
        same = [v.name for v in spec.variants if v.precision.value == wanted]
        if same:
            return [(FIELD, f"'{wanted}' names {len(same)} variants ({', '.join(same)}): name one of them")]
        return [(FIELD, f"'{wanted}' is not a variant of this spec (variants: {', '.join(names)}); add a "
                        f"variant of that precision, name one of these, or set smoke.reference: source")]
    judged = [v for v in spec.variants if v.precision.rank < sibling.precision.rank]
    if not judged:
        return [(FIELD, f"variant {sibling.name} is not of higher precision than any other variant "
                        f"({', '.join(names)}): a sibling reference must be more precise than the units it judges "
                        "(fp32 > bf16, fp16 > fp8, int8_wo > int4_awq, int4_wo, nvfp4); name a more precise "
                        "variant, or set smoke.reference: source")]
    problems = []
    targets = [t.name for t in spec.targets]
    for v in judged:
        missing = [t for t in targets if on_target(v, t) and not on_target(sibling, t)]
        if missing:
            problems.append((FIELD, f"variant {v.name} is built for targets {missing} where its sibling "
                                    f"{sibling.name} is not (variants[].targets): add those targets to "
                                    f"{sibling.name}, or restrict {v.name}"))
    return problems
