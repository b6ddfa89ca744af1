"""Toolchain-bump rollouts (issue 23, deliverable 3), the domain part: a new TensorRT-LLM release, image digest or
lane version against the baseline's recorded toolchain is a change; the old-vs-new row names each regression."""

from __future__ import annotations

from enginefoundry.records.promotion import Decision, PromotionPolicy
from enginefoundry.rollout.compare import comparison_row, describe_toolchain, markdown
from enginefoundry.rollout.source_change import toolchain_differs as differs
from enginefoundry.schemas.manifest import Manifest, ToolchainIdentity

OLD = {"lane": "reference", "trtllm_version": None, "image_digest": "sha256:" + "a" * 64,
       "versions": {"torch": "2.5.1", "transformers": "4.57.0"}}


def manifest(toolchain: dict, agreement: float = 1.0, tok_s: float = 100.0, ttft: float = 50.0) -> Manifest:
    points = [{"scenario": "short", "concurrency": c, "valid": True, "output_tokens_per_s": tok_s * c,
               "ttft_ms_p95": ttft * c} for c in (1, 4)]
    return Manifest(key="k", key_components={"toolchain": toolchain}, model="m", unit="fp32-tp1.chat.cpu",
                    lane="reference", target={}, variant={}, profile={}, source={}, files=[], status="candidate",
                    smoke={"smoke_agreement": agreement}, benchmark={"points": points})


def test_a_new_image_digest_release_or_lane_version_is_a_toolchain_change():
    def toolchain_differs(current: dict, recorded: dict) -> str | None:  # as manifests and runs record them
        return differs(ToolchainIdentity.model_validate(current), ToolchainIdentity.model_validate(recorded))

    assert toolchain_differs(dict(OLD), OLD) is None
    new_image = {**OLD, "image_digest": "sha256:" + "b" * 64}
    assert toolchain_differs(new_image, OLD).startswith("toolchain changed: image_digest sha256:aaa")
    assert "trtllm_version 1.2.1 → 1.3.0" in toolchain_differs({**OLD, "trtllm_version": "1.3.0"},
                                                               {**OLD, "trtllm_version": "1.2.1"})
    bumped = {**OLD, "versions": {"torch": "2.5.1", "transformers": "4.58.0"}}
    assert toolchain_differs(bumped, OLD) == "toolchain changed: transformers 4.57.0 → 4.58.0"
    # No toolchain on this host (a CPU-only parent): the spec's fields decide; an old manifest records none.
    assert toolchain_differs({**bumped, "versions": None}, OLD) is None
    assert toolchain_differs(new_image, {}) is None


def test_the_comparison_row_shows_old_vs_new_at_one_operating_point_and_names_the_regressions():
    new_tc = {**OLD, "image_digest": "sha256:" + "b" * 64}
    champion, candidate = manifest(OLD), manifest(new_tc, agreement=0.9, tok_s=50.0, ttft=80.0)
    decision = Decision(stem="cpu", unit="fp32-tp1.chat.cpu", action="held", candidate_version="2",
                        champion_before="1")
    row = comparison_row(decision, candidate, champion, PromotionPolicy())
    assert row.operating_point == "short c=4"
    assert (row.tokens_per_s_old, row.tokens_per_s_new) == (400.0, 200.0)
    assert (row.ttft_p95_ms_old, row.ttft_p95_ms_new) == (200.0, 320.0)
    assert (row.accuracy_old, row.accuracy_new) == (1.0, 0.9)
    assert [r.split(" ")[0] for r in row.regressions] == ["smoke_agreement", "short", "short"]
    assert "output tok/s" in row.regressions[1] and "TTFT" in row.regressions[2]
    old = ToolchainIdentity.model_validate(OLD)
    assert row.old_toolchain == describe_toolchain(old) and "image sha256:bbbbbbbbbbb" in row.new_toolchain
    table = markdown("old vs new", [row])
    assert "| cpu | v1 → v2 |" in table and "400.0 → 200.0" in table and "| held |" in table


def priced(m: Manifest, usd_per_mtok: float | None, slo: dict | None = None) -> Manifest:
    search = {"slo": slo or {"ttft_p95_ms": 500.0},
              "cost": {} if usd_per_mtok is None else {"usd_per_mtok": usd_per_mtok}}
    return Manifest.model_validate({**m.model_dump(), "benchmark": {**m.benchmark.model_dump(), "search": search}})


def test_the_comparison_shows_cost_old_vs_new_and_names_a_cost_regression_when_the_limit_is_set():
    new_tc = {**OLD, "image_digest": "sha256:" + "b" * 64}
    decision = Decision(stem="cpu", unit="fp32-tp1.chat.cpu", action="held", candidate_version="2",
                        champion_before="1")
    champion, candidate = priced(manifest(OLD), 2.0), priced(manifest(new_tc), 3.0)
    row = comparison_row(decision, candidate, champion, PromotionPolicy(max_cost_increase=0.1))
    assert (row.usd_per_mtok_old, row.usd_per_mtok_new) == (2.0, 3.0)
    assert row.row()["$/1M tok"] == "2 → 3" and "| 2 → 3 |" in markdown("t", [row])
    assert row.regressions == ["cost regression: $/1M output tokens 3 vs champion 2 (×1.50, needs ≤ ×1.10)"]
    assert row.model_dump(mode="json")["usd_per_mtok_new"] == 3.0
    # Without the limit the cost is shown, not judged.
    assert comparison_row(decision, candidate, champion, PromotionPolicy()).regressions == []
    # A side with no measured cost: "unavailable", never zero.
    unknown = comparison_row(decision, priced(manifest(new_tc), None), champion, PromotionPolicy())
    assert unknown.usd_per_mtok_new is None and unknown.row()["$/1M tok"] == "unavailable"
    assert comparison_row(decision, manifest(new_tc), manifest(OLD), PromotionPolicy()).row()["$/1M tok"] \
        == "unavailable"
