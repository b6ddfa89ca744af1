"""The smoke stage: served answers against the local Hugging Face reference, judged by a statistical gate."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from enginefoundry.errors import ToolError
from enginefoundry.identity import TOKENIZER_FILES, digest_files, list_files
from enginefoundry.runner import exited_after_error
from enginefoundry.smoke.client import ChatClient, TokenLogprob
from enginefoundry.smoke.gate import GateRule, GateVerdict, judge, wilson_lower_bound
from enginefoundry.smoke.lm_eval import LmEvalConfig, LmEvalResult, run_lm_eval
from enginefoundry.smoke.logprobs import LogprobComparison, compare_logprobs
from enginefoundry.smoke.prompts import PromptSet, load_prompt_set
from enginefoundry.smoke.reference import reference_answers
from enginefoundry.spec import SmokeSpec

__all__ = [
    "LmEvalConfig", "LmEvalResult", "LogprobComparison", "SmokeReport", "load_prompt_set", "run_lm_eval",
    "run_smoke", "tokenizer_digest", "wilson_lower_bound", "write_report",
]


class CaseResult(BaseModel):
    id: str
    served: str
    reference: str
    agree: bool
    first_n_agree: bool
    served_correct: bool | None
    reference_correct: bool | None


class SmokeReport(BaseModel):
    n: int
    agree: int
    agreement: float
    agreement_lower_bound: float
    first_n_agreement: float
    served_accuracy: float | None
    reference_accuracy: float | None
    tokenizer_match: bool
    served_tokenizer_digest: str
    reference_tokenizer_digest: str
    verdict: GateVerdict
    duration_s: float
    cases: list[CaseResult]
    logprobs: LogprobComparison | None = None
    lm_eval: LmEvalResult | None = None

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def summary(self) -> dict[str, float | bool | int]:
        """Flat numbers for manifests and MLflow."""
        out: dict[str, float | bool | int] = {
            "smoke_n": self.n, "smoke_agreement": self.agreement,
            "smoke_agreement_lower_bound": self.agreement_lower_bound,
            "smoke_first_n_agreement": self.first_n_agreement, "smoke_passed": self.passed,
            "smoke_tokenizer_match": self.tokenizer_match,
        }
        if self.served_accuracy is not None:
            out["smoke_accuracy"] = self.served_accuracy
        if self.reference_accuracy is not None:
            out["smoke_reference_accuracy"] = self.reference_accuracy
        if self.logprobs is not None and self.logprobs.mean_abs_diff is not None:
            out["smoke_logprob_mean_abs_diff"] = self.logprobs.mean_abs_diff
            out["smoke_logprob_max_abs_diff"] = self.logprobs.max_abs_diff or 0.0
        if self.lm_eval is not None:
            out.update(self.lm_eval.summary())
        return out

    def markdown(self) -> str:
        rows = [
            "| metric | value |", "|---|---|",
            f"| prompts | {self.n} |",
            f"| greedy agreement | {self.agree}/{self.n} ({self.agreement:.3f}) |",
            f"| agreement lower bound | {self.agreement_lower_bound:.3f} |",
            f"| first-N-token agreement | {self.first_n_agreement:.3f} |",
            f"| accuracy (served / reference) | {_fmt(self.served_accuracy)} / {_fmt(self.reference_accuracy)} |",
            f"| tokenizer digest match | {'yes' if self.tokenizer_match else 'NO'} |",
            f"| log-probs vs reference | {self.logprobs.detail if self.logprobs else 'not checked'} |",
        ]
        if self.lm_eval is not None:
            rows.append(f"| lm-eval ({self.lm_eval.status}) | {self.lm_eval.detail} |")
        rows.append(f"| verdict | {'PASS' if self.passed else 'FAIL'}: {self.verdict.reason} |")
        rows += ["", "| rule | ok | detail |", "|---|---|---|"]
        rows += [f"| {r.name} | {'yes' if r.ok else 'NO'} | {r.detail} |" for r in self.verdict.rules]
        return "\n".join(rows) + "\n"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def tokenizer_digest(folder: Path) -> str:
    files = [p for p in list_files(folder) if p.name in TOKENIZER_FILES]
    return digest_files(folder, files)[0]


def run_smoke(
    spec: SmokeSpec, prompts: PromptSet, *, reference_dir: Path, base_url: str, model_name: str,
    served_tokenizer_dir: Path, progress: Callable[[str], None] = print,
    server_alive: Callable[[], bool] | None = None, max_logprob_diff: float | None = None,
) -> SmokeReport:
    """Every prompt through the reference and the endpoint, then the gate.

    Raises ToolError (one line first: which prompt, how many answered) when the endpoint stops
    answering; `server_alive` lets it say that the server process died rather than "connection refused"
    (asked until the process has had time to exit: runner.exited_after_error).
    """
    t0 = time.monotonic()
    cases = prompts.cases
    progress(f"smoke: {len(cases)} prompts through the local reference ({spec.reference_precision})")
    refs = {r.id: r for r in reference_answers(reference_dir, cases, dtype=spec.reference_precision,
                                               max_new_tokens=spec.max_new_tokens)}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reference_dir)
    client = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens)
    results = []
    served_logprobs: dict[str, list[TokenLogprob] | None] = {}
    for i, case in enumerate(cases, start=1):
        try:
            answer = client.answer(case)
        except ToolError as err:
            if server_alive is not None and exited_after_error(server_alive):
                raise ToolError(f"smoke: the server died during the smoke test: {i - 1}/{len(cases)} prompts "
                                f"answered, no answer for '{case.id}'") from None
            raise ToolError(f"{str(err).splitlines()[0]} ({i - 1}/{len(cases)} prompts answered)") from None
        served = answer.text
        served_logprobs[case.id] = answer.logprobs
        ref = refs[case.id]
        served_ids = tok(served, add_special_tokens=False)["input_ids"]
        n = spec.first_n_tokens
        results.append(CaseResult(
            id=case.id, served=served, reference=ref.text, agree=served == ref.text,
            first_n_agree=served_ids[:n] == ref.token_ids[:n],
            served_correct=case.is_correct(served), reference_correct=case.is_correct(ref.text),
        ))
        if i % 25 == 0:
            progress(f"smoke: {i}/{len(cases)} prompts answered")
    n = len(results)
    agree = sum(r.agree for r in results)
    graded = [r for r in results if r.served_correct is not None]
    served_acc = sum(bool(r.served_correct) for r in graded) / len(graded) if graded else None
    ref_acc = sum(bool(r.reference_correct) for r in graded) / len(graded) if graded else None
    logprobs = compare_logprobs(served_logprobs, refs, refused=client.logprobs_refused)
    progress(f"smoke: log-probs: {logprobs.detail}")
    served_tok = tokenizer_digest(served_tokenizer_dir)
    ref_tok = tokenizer_digest(reference_dir)
    verdict = judge(agree=agree, n=n, min_agreement=spec.min_agreement, confidence=spec.confidence,
                    min_samples=spec.min_samples, served_accuracy=served_acc, reference_accuracy=ref_acc,
                    max_accuracy_drop=spec.max_accuracy_drop, logprob_mean_abs_diff=logprobs.mean_abs_diff,
                    max_logprob_diff=max_logprob_diff, logprob_tokens=logprobs.tokens_compared)
    # The tokenizer rule: a served tokenizer that differs from the reference's breaks every client that
    # counts or templates tokens, even when greedy text happens to agree.
    verdict = verdict.with_rule(GateRule(
        name="tokenizer", ok=served_tok == ref_tok,
        detail=(f"served tokenizer digest {served_tok[:12]} = reference" if served_tok == ref_tok else
                f"served tokenizer digest {served_tok[:12]} ≠ reference {ref_tok[:12]}")))
    return SmokeReport(
        n=n, agree=agree, agreement=agree / n, agreement_lower_bound=wilson_lower_bound(agree, n, spec.confidence),
        first_n_agreement=sum(r.first_n_agree for r in results) / n, served_accuracy=served_acc,
        reference_accuracy=ref_acc, tokenizer_match=served_tok == ref_tok, served_tokenizer_digest=served_tok,
        reference_tokenizer_digest=ref_tok, verdict=verdict, duration_s=round(time.monotonic() - t0, 2),
        cases=results, logprobs=logprobs,
    )


def write_report(report: SmokeReport, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "smoke.json", folder / "smoke.md"
    js.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    md.write_text(report.markdown())
    return [js, md]
