"""The smoke stage's report: per-case results, per-slice summaries, the verdict, and their JSON/markdown forms."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.smoke.gate import CaseEvidence, GateVerdict, wilson_lower_bound
from enginefoundry.smoke.lm_eval import LmEvalResult
from enginefoundry.smoke.logprobs import LogprobComparison, LogprobSpread, TeacherForced
from enginefoundry.smoke.policy import GatePolicy
from enginefoundry.smoke.reference import ReferenceAnswer, ReferenceOutcome
from enginefoundry.store.manifest import BuildInput


class CaseResult(BaseModel):
    id: str
    served: str
    reference: str
    agree: bool
    first_n_agree: bool
    matched_prefix: int
    served_correct: bool | None
    reference_correct: bool | None
    finish_reason: str | None = None
    refused: str | None = None
    slice: str | None = None


class SliceSummary(BaseModel):
    """One named slice of the prompt set (PromptCase.slice), measured on its own as the gate judges it."""

    name: str
    n: int
    agree: int
    first_n_agree: int
    first_n_agreement: float
    first_n_lower_bound: float
    mean_prefix_share: float
    served_accuracy: float | None
    reference_accuracy: float | None
    tf_mean_abs_diff: float | None = None  # teacher-forced mean |Δ log-prob| of the slice's reference tokens

    @classmethod
    def of(cls, name: str, cases: list[CaseEvidence], first_n: int, confidence: float,
           teacher: TeacherForced | None = None) -> SliceSummary:
        n = len(cases)
        first = sum(c.first_n_agree(first_n) for c in cases)
        graded = [c for c in cases if c.served_correct is not None and c.reference_correct is not None]
        return cls(
            name=name, n=n, agree=sum(c.agree for c in cases), first_n_agree=first, first_n_agreement=first / n,
            first_n_lower_bound=round(wilson_lower_bound(first, n, confidence), 4),
            mean_prefix_share=round(sum(c.prefix_share for c in cases) / n, 4),
            served_accuracy=sum(bool(c.served_correct) for c in graded) / len(graded) if graded else None,
            reference_accuracy=sum(bool(c.reference_correct) for c in graded) / len(graded) if graded else None,
            tf_mean_abs_diff=teacher.mean_abs_diff if teacher is not None else None)

    def metric_prefix(self) -> str:
        return "smoke_slice_" + self.name.replace("-", "_")


class SmokeReport(BaseModel):
    n: int
    agree: int
    agreement: float
    agreement_lower_bound: float
    first_n_agreement: float
    mean_prefix_share: float
    served_accuracy: float | None
    reference_accuracy: float | None
    tokenizer_match: bool | None  # None: no served tokenizer folder to compare
    served_tokenizer_digest: str | None
    reference_tokenizer_digest: str
    precision: str
    reference: ReferenceOutcome
    verdict: GateVerdict
    duration_s: float
    cases: list[CaseResult]
    logprobs: LogprobComparison | None = None
    teacher_forced: TeacherForced | None = None  # the reference's answers scored under the served model
    spread: LogprobSpread | None = None  # measured at the reference's precision: the log-prob bounds follow from it
    lm_eval: LmEvalResult | None = None
    slices: list[SliceSummary] = []  # one per named slice of the prompt set; empty when it has none
    # Which server was judged, where the pipeline started it (its command's description: "transformers serve",
    # "enginefoundry scoring server"); None where a URL was judged (`enginefoundry smoke`).
    server: str | None = None
    # What the endpoint answered, in the reference's form: a sibling unit's answers judge lower precisions
    # (reference.publish_sibling_reference). Not written to smoke.json (reports stay as they were).
    served_answers: list[ReferenceAnswer] = Field(default_factory=list, exclude=True)
    # What the gate consumed besides the reference stage's answers (the spread, the source's answers of the
    # quantization-cost rule), each bound by digest (evidence/inputs.py); in the unit's manifest, not in smoke.json.
    inputs: list[BuildInput] = Field(default_factory=list, exclude=True)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def summary(self) -> dict[str, float | bool | int]:
        """Flat numbers for manifests and MLflow."""
        out: dict[str, float | bool | int] = {
            "smoke_n": self.n, "smoke_agreement": self.agreement,
            "smoke_agreement_lower_bound": self.agreement_lower_bound,
            "smoke_first_n_agreement": self.first_n_agreement, "smoke_prefix_share": self.mean_prefix_share,
            "smoke_passed": self.passed,
        }
        if self.policy is not None:
            out["smoke_min_samples"] = self.policy.min_samples
        if self.tokenizer_match is not None:
            out["smoke_tokenizer_match"] = self.tokenizer_match
        if self.served_accuracy is not None:
            out["smoke_accuracy"] = self.served_accuracy
        if self.reference_accuracy is not None:
            out["smoke_reference_accuracy"] = self.reference_accuracy
        if self.teacher_forced is not None and self.teacher_forced.mean_abs_diff is not None:
            out["smoke_tf_logprob_mean_abs_diff"] = self.teacher_forced.mean_abs_diff
            if self.teacher_forced.top1_agreement is not None:
                out["smoke_tf_top1_agreement"] = self.teacher_forced.top1_agreement
        if self.logprobs is not None and self.logprobs.mean_abs_diff is not None:
            out["smoke_logprob_mean_abs_diff"] = self.logprobs.mean_abs_diff
            out["smoke_logprob_max_abs_diff"] = self.logprobs.max_abs_diff or 0.0
        for sl in self.slices:
            key = sl.metric_prefix()
            out[f"{key}_n"] = sl.n
            out[f"{key}_first_n_agreement"] = sl.first_n_agreement
            out[f"{key}_prefix_share"] = sl.mean_prefix_share
            if sl.served_accuracy is not None:
                out[f"{key}_accuracy"] = sl.served_accuracy
            if sl.tf_mean_abs_diff is not None:
                out[f"{key}_tf_logprob_mean_abs_diff"] = sl.tf_mean_abs_diff
        if self.lm_eval is not None:
            out.update(self.lm_eval.summary())
        out["smoke_checks_not_run"] = len(self.verdict.skipped)
        return out

    @property
    def policy(self) -> GatePolicy | None:
        return self.verdict.policy

    def tags(self) -> dict[str, str]:
        """Strings for MLflow tags: which reference and which policy judged the unit."""
        tags = {mltags.SMOKE_REFERENCE_KEY: self.reference.key, mltags.SMOKE_REFERENCE: self.reference.label()}
        if self.policy is not None:
            tags[mltags.SMOKE_POLICY] = self.policy.family.value
        if self.server is not None:
            tags[mltags.SMOKE_SERVER] = self.server
        # Checks that could not run, on the run itself (never a silent skip): "2 checks not run: …", or "none".
        tags[mltags.SMOKE_NOT_RUN] = self.verdict.not_run_summary() or "none"
        tags[mltags.SMOKE_REFERENCE_WHY] = (self.verdict.reference_why or "n/a")[:4800]
        return tags

    def markdown(self) -> str:
        rows = [
            "| metric | value |", "|---|---|",
            f"| judged against | {self.reference.label()} |",
            *([f"| server judged | {self.server} |"] if self.server is not None else []),
            f"| why that reference | {self.verdict.reference_why or 'n/a'} |",
            f"| policy | {self.policy.family.value if self.policy else 'n/a'} ({self.precision}) |",
            f"| prompts | {self.n} |",
            f"| full-answer agreement | {self.agree}/{self.n} ({self.agreement:.3f}) |",
            f"| first-N-token agreement | {self.first_n_agreement:.3f} |",
            f"| mean matched prefix share | {self.mean_prefix_share:.3f} |",
            f"| accuracy (served / reference) | {_fmt(self.served_accuracy)} / {_fmt(self.reference_accuracy)} |",
            f"| tokenizer digest match | {_yes(self.tokenizer_match)} |",
            f"| log-probs vs reference | {self.logprobs.detail if self.logprobs else 'not checked'} |",
            f"| teacher-forced log-probs | {self.teacher_forced.detail if self.teacher_forced else 'not checked'} |",
            f"| log-prob spread at the reference's precision | {self.spread.describe() if self.spread else 'none'} |",
        ]
        for sl in self.slices:
            rows.append(f"| slice {sl.name} | {sl.n} prompts; first-N {sl.first_n_agree}/{sl.n} "
                        f"({sl.first_n_agreement:.3f}, lower bound {sl.first_n_lower_bound:.3f}); "
                        f"prefix share {sl.mean_prefix_share:.3f}; full "
                        f"{sl.agree}/{sl.n}; accuracy {_fmt(sl.served_accuracy)} / {_fmt(sl.reference_accuracy)}"
                        + (f"; teacher-forced mean |Δ log-prob| {sl.tf_mean_abs_diff:.4f}"
                           if sl.tf_mean_abs_diff is not None else "") + " |")
        if self.lm_eval is not None:
            rows.append(f"| lm-eval ({self.lm_eval.status}) | {self.lm_eval.detail} |")
        rows.append(f"| verdict | {'PASS' if self.passed else 'FAIL'}: {self.verdict.reason} |")
        rows += ["", "| rule | kind | ok | detail |", "|---|---|---|---|"]
        rows += [f"| {r.name} | {r.kind} | {'warn' if r.warning else 'yes' if r.ok else 'NO'} | {r.detail} |"
                 for r in self.verdict.rules]
        return "\n".join(rows) + "\n"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _yes(x: bool | None) -> str:
    return "not checked" if x is None else "yes" if x else "NO"



def write_report(report: SmokeReport, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "smoke.json", folder / "smoke.md"
    js.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    md.write_text(report.markdown())
    return [js, md]
