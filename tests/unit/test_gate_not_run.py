"""No silent skips (issue 39): a check that could not run makes the closing line say so, never "all rules passed";
the unit's MLflow tags, metrics and verdict carry it; `smoke.logprob_checks: required` turns it into a failure and is
refused at plan and validate for a lane whose smoke server cannot serve the log-probs. Hand-made evidence."""

from __future__ import annotations

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.smoke.client import ScoredToken
from enginefoundry.smoke.gate import CaseEvidence, JudgeInputs, judge
from enginefoundry.smoke.logprobs import compare_teacher_forced
from enginefoundry.smoke.policy import policy_for
from enginefoundry.smoke.reference import ReferenceAnswer
from enginefoundry.spec import parse_spec
from tests.support.paths import CONFIGS

NO_CHAT = "the endpoint returned no log-probs in 60 answers (it ignores `logprobs: true, top_logprobs: 1`)"
NO_ECHO = "the endpoint answered HTTP 400 to `echo: true` with token ids (prompt must be a string.)"
TRTLLM_ECHO = "the endpoint returned 1 token log-probs for an echoed prompt of 61 tokens"


def _cases(n: int = 60) -> list[CaseEvidence]:
    return [CaseEvidence(id=f"q{i}", served="a b c", reference="a b c", served_ids=[1, 2, 3], reference_ids=[1, 2, 3],
                         served_correct=True, reference_correct=True, served_finish="stop", reference_finish="stop")
            for i in range(n)]


def _judge(**kw):
    return judge(_cases(), policy_for("bf16"),
                 JudgeInputs(max_new_tokens=16, reference_tokenizer_digest="t" * 64, **kw))


def test_a_pass_with_log_prob_checks_not_run_says_so_and_never_all_rules_passed():
    """transformers serve: neither log-prob check runs (the issue's scaled final norm passed with 'all rules
    passed')."""
    v = _judge(logprob_unavailable=NO_CHAT, teacher_forced=compare_teacher_forced({}, {}, unavailable=NO_ECHO))
    assert v.passed
    assert v.reason == "passed; 2 checks not run: the server returns no log-probs"
    assert [r.name for r in v.skipped] == ["log-prob distance", "teacher-forced log-probs"]
    everything = _judge(logprob_mean_abs_diff=0.01, logprob_tokens=60,
                        teacher_forced=compare_teacher_forced({"q0": [ScoredToken(logprob=-0.2, top1=True)]},
                                                              {"q0": ReferenceAnswer(id="q0", text="x", token_ids=[1],
                                                                                     token_logprobs=[-0.2])}))
    assert everything.passed and everything.reason == "all rules passed" and not everything.skipped


def test_checks_not_run_for_different_reasons_are_named_one_by_one_and_follow_a_failure():
    """trtllm-serve: chat log-probs, no prompt log-probs; a failed rule still names what did not run."""
    v = _judge(logprob_mean_abs_diff=0.5, logprob_tokens=60,
               teacher_forced=compare_teacher_forced({}, {}, unavailable=TRTLLM_ECHO))
    assert not v.passed
    assert v.reason.startswith("log-prob distance: mean |Δ log-prob| 0.5000 over 60 tokens > limit 0.15")
    assert v.reason.endswith("; 1 check not run: the server returns no prompt log-probs")
    mixed = _judge(logprob_unavailable=NO_CHAT,
                   teacher_forced=compare_teacher_forced({}, {}, unavailable="no answer was scored"))
    assert mixed.reason == ("passed; 2 checks not run: log-prob distance (the server returns no log-probs), "
                            "teacher-forced log-probs (the reference has no log-probs)")


def test_required_log_prob_checks_fail_the_verdict_when_they_cannot_run():
    v = _judge(logprob_unavailable=NO_CHAT, teacher_forced=compare_teacher_forced({}, {}, unavailable=NO_ECHO),
               logprobs_required=True)
    assert not v.passed and [r.name for r in v.failed] == ["log-prob distance", "teacher-forced log-probs"]
    assert all(r.kind == "hard" and "smoke.logprob_checks is required" in r.detail for r in v.failed)


def test_the_unit_run_and_its_outcome_carry_the_checks_not_run():
    from enginefoundry import tracking_tags as mltags
    from enginefoundry.records.outcomes import verdict
    from enginefoundry.smoke import SmokeReport
    from enginefoundry.smoke.reference import ReferenceOutcome

    v = _judge(logprob_unavailable=NO_CHAT, teacher_forced=compare_teacher_forced({}, {}, unavailable=NO_ECHO),
               reference_why="the unit's own precision bf16 (like with like)")
    report = SmokeReport(n=60, agree=60, agreement=1.0, agreement_lower_bound=0.94, first_n_agreement=1.0,
                         mean_prefix_share=1.0, served_accuracy=1.0, reference_accuracy=1.0, tokenizer_match=None,
                         served_tokenizer_digest=None, reference_tokenizer_digest="t" * 64, precision="bf16",
                         reference=ReferenceOutcome(key="k" * 64, source="computed", dtype="bf16", model_dir="/m"),
                         verdict=v, duration_s=1.0, cases=[])
    tags = report.tags()
    assert tags[mltags.SMOKE_NOT_RUN] == "2 checks not run: the server returns no log-probs"
    assert tags[mltags.SMOKE_REFERENCE_WHY] == "the unit's own precision bf16 (like with like)"
    assert report.summary()["smoke_checks_not_run"] == 2
    unit = verdict(report, None)  # the manifest's status_reason, the Prefect artifact's and the run's reason column
    assert unit.passed and unit.reason == "smoke gate passed; 2 checks not run: the server returns no log-probs"
    ran = report.model_copy(update={"verdict": _judge()})
    assert ran.tags()[mltags.SMOKE_NOT_RUN] == "none" and verdict(ran, None).reason == ""


def _spec(lane_patch: dict, **smoke):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data.update(lane_patch)
    data["smoke"].update(smoke)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def test_required_log_prob_checks_are_refused_at_validate_and_plan_for_a_server_without_them():
    from enginefoundry.planning.plan_report import plan_report
    from enginefoundry.planning.validate import validate_deep

    scoring = _spec({}, logprob_checks="required")  # the reference lane's scoring server returns both
    validate_deep(scoring)
    transformers = _spec({"lane_options": {"smoke_server": "transformers"}}, logprob_checks="required")
    with pytest.raises(SpecError) as err:
        validate_deep(transformers)
    (problem,) = [p for p in err.value.problems if p[0] == "smoke.logprob_checks"]
    assert "transformers serve returns no log-probs" in problem[1]
    assert "set smoke.logprob_checks: when-served" in problem[1]
    refused = plan_report(transformers).preflight
    assert all(any("smoke.logprob_checks: required" in c.message for c in r.problems) for r in refused.values())
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())  # lane trtllm: trtllm-serve
    data["smoke"]["logprob_checks"] = "required"
    with pytest.raises(SpecError) as err:
        validate_deep(parse_spec(data, source="test spec", base_dir=CONFIGS))
    assert any("trtllm-serve returns no prompt log-probs" in m for f, m in err.value.problems
               if f == "smoke.logprob_checks")
