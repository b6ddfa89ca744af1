"""The smoke stage: served answers against the Hugging Face reference, judged by the gate (gate.py, policy.py).

`run_smoke(SmokeInputs(...))` (run.py) is the one entry for the pipeline's smoke stage and the `enginefoundry smoke`
command: reference → ask → score → judge. ask.py asks the endpoint, report.py is the report it returns.
"""

from __future__ import annotations

from enginefoundry.smoke.ask import (
    ask_all,
    check_prompt_count,
    last_error_line,
    tokenizer_digest,
    twin_answers,
    with_twin_answers,
)
from enginefoundry.smoke.gate import GateRule, GateVerdict, wilson_lower_bound
from enginefoundry.smoke.lm_eval import LmEvalConfig, LmEvalResult, run_lm_eval
from enginefoundry.smoke.logprobs import LogprobComparison
from enginefoundry.smoke.policy import GatePolicy, policy_for, policy_table_markdown
from enginefoundry.smoke.prompts import load_prompt_set
from enginefoundry.smoke.reference import ReferenceAsk, ReferenceSettings, load_or_compute_reference
from enginefoundry.smoke.report import CaseResult, SliceSummary, SmokeReport, write_report
from enginefoundry.smoke.run import SmokeInputs, run_smoke
from enginefoundry.spec.checks import COMPUTABLE, UNIT_PRECISION, reference_precision_for

__all__ = [
    "COMPUTABLE", "UNIT_PRECISION", "CaseResult", "GatePolicy", "GateRule", "GateVerdict", "LmEvalConfig",
    "LmEvalResult", "LogprobComparison", "ReferenceAsk", "ReferenceSettings", "SliceSummary", "SmokeInputs",
    "SmokeReport", "ask_all",
    "check_prompt_count", "last_error_line", "load_or_compute_reference", "load_prompt_set", "policy_for",
    "policy_table_markdown", "reference_precision_for", "run_lm_eval", "run_smoke", "tokenizer_digest",
    "twin_answers", "wilson_lower_bound", "with_twin_answers", "write_report",
]
