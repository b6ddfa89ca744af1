"""Promotion gates, alias naming, the registry moves (on a local MLflow), change detection, placement and the
relocatable serving files: the domain parts of rollouts, without Prefect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from enginefoundry.errors import InputError
from enginefoundry.records.promotion import PromotionPolicy, Registry, compare
from enginefoundry.rollout.source_change import SourceState, differs
from enginefoundry.schemas.manifest import SourcePart
from enginefoundry.spec import SourceKind
from enginefoundry.store.manifest import Manifest


def manifest(status: str = "candidate", agreement: float = 1.0, tok_s: float = 100.0, ttft: float = 50.0,
             concurrency: tuple[int, ...] = (2,)) -> Manifest:
    points = [{"scenario": "short", "concurrency": c, "valid": True, "output_tokens_per_s": tok_s * c,
               "ttft_ms_p95": ttft * c} for c in concurrency]
    return Manifest(key="k", key_components={}, model="m", unit="fp32-tp1.chat.cpu", lane="reference", target={},
                    variant={}, profile={}, source={}, files=[], status=status,
                    status_reason="smoke gate: 0.5 < 0.95" if status == "rejected" else "",
                    smoke={"smoke_agreement": agreement}, benchmark={"points": points})


def test_first_build_promotes_on_its_own_gates_and_a_rejected_unit_never() -> None:
    policy = PromotionPolicy()
    assert compare(manifest(), None, policy).promote
    rejected = compare(manifest(status="rejected"), None, policy)
    assert not rejected.promote
    assert rejected.reasons == ["unit is rejected: smoke gate: 0.5 < 0.95"]
    assert not compare(manifest(status="rejected", tok_s=1000), manifest(), policy).promote


@pytest.mark.parametrize(("candidate", "failing"), [
    (manifest(agreement=0.97), "smoke_agreement 0.970 vs champion 1.000"),
    (manifest(tok_s=89.0), "short c=2 output tok/s 178.0 (one sample) vs champion 200.0 (one sample) (×0.89, no "
                           "interval), needs ≥ ×0.90"),
    (manifest(ttft=63.0), "short c=2 TTFT p95 ms 126 (one sample) vs champion 100 (one sample) (×1.26, no "
                          "interval), needs ≤ ×1.25"),
])
def test_each_gate_holds_a_worse_candidate(candidate: Manifest, failing: str) -> None:
    verdict = compare(candidate, manifest(), PromotionPolicy())
    assert not verdict.promote
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith(failing)


def test_within_tolerance_promotes_and_compares_at_the_highest_common_concurrency() -> None:
    champion = manifest(concurrency=(1, 4))
    candidate = manifest(agreement=0.99, tok_s=95.0, ttft=60.0, concurrency=(1, 4, 8))
    verdict = compare(candidate, champion, PromotionPolicy())
    assert verdict.promote, verdict.reasons
    assert any("c=4" in g.detail for g in verdict.gates) and not any("c=8" in g.detail for g in verdict.gates)
    at_one = compare(candidate, champion, PromotionPolicy(reference_concurrency=1))
    assert all("c=4" not in g.detail for g in at_one.gates if g.name.startswith("short"))


def test_no_common_benchmark_point_holds() -> None:
    verdict = compare(manifest(concurrency=(8,)), manifest(concurrency=(2,)), PromotionPolicy())
    assert not verdict.promote
    assert "no valid benchmark point in common" in verdict.reasons[0]


@pytest.fixture
def registry(tmp_path: Path) -> tuple[Registry, Any]:
    reg = Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    reg.client.create_registered_model("m")
    for status in ("candidate", "candidate", "rejected", "candidate"):
        reg.client.create_model_version("m", source=str(tmp_path), tags={"enginefoundry.status": status})
    return reg, reg.client


def test_promote_and_rollback_walk_the_champion_history(registry: tuple[Registry, Any]) -> None:
    reg, client = registry
    assert reg.promote("m", "cpu", "1", "first").action == "promoted"
    assert reg.promote("m", "cpu", "1", "again").action == "unchanged"
    move = reg.promote("m", "cpu", "2", "better")
    assert (move.champion, move.previous) == ("2", "1")
    reg.promote("m", "cpu", "4", "better still")
    assert str(client.get_model_version_by_alias("m", "cpu-previous-champion").version) == "2"
    assert client.get_model_version("m", "2").tags["enginefoundry.superseded_by"] == "4"

    assert reg.rollback("m", "cpu").champion == "2"
    assert str(client.get_model_version_by_alias("m", "cpu-previous-champion").version) == "1"
    assert reg.rollback("m", "cpu").champion == "1"
    assert "cpu-previous-champion" not in client.get_registered_model("m").aliases
    with pytest.raises(InputError, match="nothing to roll back to"):
        reg.rollback("m", "cpu")
    with pytest.raises(InputError, match="a rejected unit is never promoted"):
        reg.promote("m", "cpu", "3", "by hand")
    assert str(client.get_model_version_by_alias("m", "cpu-champion").version) == "1"


def test_change_detection_compares_the_recorded_source() -> None:
    hf = SourceState(uri="hf://org/m@main", kind=SourceKind.HF, revision="b" * 40)
    def recorded(**fields: str) -> SourcePart:
        return SourcePart.model_validate(fields)

    assert differs(hf, recorded(uri="hf://org/m@main", revision="b" * 40)) is None
    assert differs(hf, recorded(uri="hf://org/m@main", revision="a" * 40)) == f"new commit {'b' * 12} (built from " \
                                                                              f"{'a' * 12})"
    assert "source changed" in str(differs(hf, recorded(uri="hf://org/other@main", revision="b" * 40)))
    s3 = SourceState(uri="s3://b/p", kind=SourceKind.S3, objects={"config.json": "e1", "model.safetensors": "e3"})
    was = SourcePart.model_validate({"uri": "s3://b/p", "identity": {"objects": {"config.json": "e1",
                                                                                 "model.safetensors": "e2"}}})
    assert differs(s3, was) == "1 object(s) changed: model.safetensors"


def test_status_tags_follow_promotion_and_rollback(tmp_path: Path) -> None:
    """The champion's version and run stop saying `candidate` (issue 25): champion, previous-champion,
    superseded, rolled-back, on the version and on the MLflow run that built it."""
    reg = Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = reg.client
    client.create_registered_model("m")
    experiment = client.create_experiment("e")
    runs = {}
    for n in ("1", "2", "3"):
        run_id = client.create_run(experiment).info.run_id
        client.set_tag(run_id, "enginefoundry.status", "candidate")
        runs[n] = run_id
        client.create_model_version("m", source=str(tmp_path), run_id=run_id,
                                    tags={"enginefoundry.status": "candidate"})

    def statuses() -> dict[str, tuple[str, str]]:
        return {n: (client.get_model_version("m", n).tags["enginefoundry.status"],
                    client.get_run(runs[n]).data.tags["enginefoundry.status"]) for n in runs}

    for n in ("1", "2", "3"):
        reg.promote("m", "cpu", n, "better")
    assert statuses() == {"1": ("superseded",) * 2, "2": ("previous-champion",) * 2, "3": ("champion",) * 2}
    reg.rollback("m", "cpu")
    assert statuses() == {"1": ("previous-champion",) * 2, "2": ("champion",) * 2, "3": ("rolled-back",) * 2}
    assert reg.promote("m", "cpu", "3", "by hand, after a fix").action == "promoted"  # its gates had passed
    assert statuses()["3"] == ("champion",) * 2 and statuses()["2"] == ("previous-champion",) * 2
