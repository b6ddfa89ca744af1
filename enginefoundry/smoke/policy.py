"""Gate defaults per precision family, in one table (docs/smoke-gate.md prints the same table).

A reduced-precision unit diverges from a higher-precision reference late in long answers (a bf16 unit of a
135M model agreed on 14/20 full answers while its task accuracy equalled the reference's): full-answer
agreement is therefore not a rule. What is judged:

  * task accuracy, paired against the reference on the same prompts, as a non-inferiority test with margin δ
    at level α; the prompt count needed for power 1 − β at the family's expected discordance ψ is derived
    (stats.min_sample_size) and a smaller prompt set is refused (or warned about, on request);
  * early divergence: the Wilson lower bound of the share of answers whose first N tokens equal the
    reference's (both texts tokenised by the reference tokenizer), and the mean matched prefix as a share of
    the reference answer; a precision change moves late tokens, a broken build moves the first ones;
  * log-prob distance on the agreeing prefix, where the endpoint returns log-probs;
  * hard checks that hold for every family: tokenizer digest and prompt token counts (tokenizer and chat
    template), EOS handling, empty or degenerate answers, truncated or refused answers.

The anchor is TensorRT-LLM's accuracy suite (NVIDIA/TensorRT-LLM
tests/integration/defs/accuracy/accuracy_core.py@00c1146, compute_threshold and HypothesisTestingParams: each
task's threshold comes from a one-sided test with α, β, σ and the sample count), adapted here to paired
binary outcomes on one prompt set.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from enginefoundry.catalog.precisions import PRECISIONS, PrecisionFamily
from enginefoundry.smoke.stats import min_sample_size

# precision value → its gate family: the catalog's `family` column (enginefoundry/catalog/precisions.py).
FAMILY_OF: dict[str, PrecisionFamily] = {p.value: row.family for p, row in PRECISIONS.items()}


class GatePolicy(BaseModel):
    """The numbers one verdict is judged by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: PrecisionFamily
    accuracy_margin: float = Field(gt=0, lt=1, description="δ: the unit may be this much less accurate")
    alpha: float = Field(gt=0, lt=0.5, description="level of the non-inferiority test")
    power: float = Field(ge=0.5, lt=1, description="1 − β at θ = 0 and the expected discordance")
    expected_discordance: float = Field(gt=0, le=1, description="ψ: share of prompts where exactly one side is right")
    first_n_tokens: int = Field(ge=1)
    min_first_n_agreement: float = Field(ge=0, le=1, description="on the 95% Wilson lower bound")
    min_prefix_share: float = Field(ge=0, le=1, description="mean matched prefix / reference answer length")
    max_degenerate_share: float = Field(ge=0, le=1, description="empty or repetitive answers the reference has not")
    max_logprob_diff: float = Field(gt=0, description="mean |Δ log-prob| per token on the agreeing prefix")

    @property
    def min_samples(self) -> int:
        return min_sample_size(margin=self.accuracy_margin, alpha=self.alpha, power=self.power,
                               discordance=self.expected_discordance)


# The one table. ψ grows as precision drops: more prompts flip between right and wrong, the same margin then
# needs more prompts; the 4-bit family gets a wider margin, as TensorRT-LLM's int4 references do.
DEFAULT_POLICIES: dict[PrecisionFamily, GatePolicy] = {
    PrecisionFamily.FULL: GatePolicy(
        family=PrecisionFamily.FULL, accuracy_margin=0.10, alpha=0.05, power=0.80, expected_discordance=0.02,
        first_n_tokens=4, min_first_n_agreement=0.80, min_prefix_share=0.70, max_degenerate_share=0.05,
        max_logprob_diff=0.05),
    PrecisionFamily.HALF: GatePolicy(
        family=PrecisionFamily.HALF, accuracy_margin=0.10, alpha=0.05, power=0.80, expected_discordance=0.05,
        first_n_tokens=4, min_first_n_agreement=0.60, min_prefix_share=0.40, max_degenerate_share=0.10,
        max_logprob_diff=0.15),
    PrecisionFamily.EIGHT: GatePolicy(
        family=PrecisionFamily.EIGHT, accuracy_margin=0.10, alpha=0.05, power=0.80, expected_discordance=0.08,
        first_n_tokens=4, min_first_n_agreement=0.50, min_prefix_share=0.30, max_degenerate_share=0.10,
        max_logprob_diff=0.30),
    PrecisionFamily.FOUR: GatePolicy(
        family=PrecisionFamily.FOUR, accuracy_margin=0.15, alpha=0.05, power=0.80, expected_discordance=0.12,
        first_n_tokens=4, min_first_n_agreement=0.40, min_prefix_share=0.20, max_degenerate_share=0.15,
        max_logprob_diff=0.50),
}


def family_of(precision: str) -> PrecisionFamily:
    try:
        return FAMILY_OF[precision]
    except KeyError:
        raise ValueError(f"unknown precision '{precision}'; one of {', '.join(FAMILY_OF)}") from None


def policy_for(precision: str, **overrides: object) -> GatePolicy:
    """The family's defaults, with the spec's explicit overrides (None values are ignored)."""
    base = DEFAULT_POLICIES[family_of(precision)]
    given = {k: v for k, v in overrides.items() if v is not None}
    return base.model_copy(update=given) if given else base


def policy_table_markdown() -> str:
    rows = ["| family | precisions | margin δ | α | power | ψ | min prompts | first-N | first-N lower bound ≥ "
            "| prefix share ≥ | degenerate ≤ | mean abs Δ log-prob ≤ |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for fam, p in DEFAULT_POLICIES.items():
        precs = ", ".join(k for k, v in FAMILY_OF.items() if v is fam)
        rows.append(f"| {fam.value} | {precs} | {p.accuracy_margin} | {p.alpha} | {p.power} | "
                    f"{p.expected_discordance} | {p.min_samples} | {p.first_n_tokens} | {p.min_first_n_agreement} | "
                    f"{p.min_prefix_share} | {p.max_degenerate_share} | {p.max_logprob_diff} |")
    return "\n".join(rows) + "\n"
