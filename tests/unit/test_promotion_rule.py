"""The promotion rule (promotion.decide_promotions) on a real SQLite MLflow registry and a real file store: a
gated `<stem>-candidate` newer than the champion (or with no champion) is compared and promoted or held whether
or not the source changed, so `run` then `rollout` promotes; a champion that already is the newest candidate
is held as "nothing new", with no registry move (hence no promotion event)."""

from __future__ import annotations

from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.promotion import PromotionPolicy, Registry, alias_stems, candidate_alias, decide_promotions
from enginefoundry.spec import BuildSpec, load_spec
from enginefoundry.store.backends import FileStore
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.publish import publish_build
from enginefoundry.tasks.track import register_published_unit

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path) -> BuildSpec:
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    data["publish"] = {"store": f"file://{tmp_path / 'store'}"}
    data["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "tiny",
                        "experiment": "rule"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_spec(path)


def _register(spec: BuildSpec, tmp_path: Path, digit: str, *, tok_s: float = 100.0, status: str = "candidate",
              weights: str = "w") -> str:
    """What `enginefoundry run` leaves behind for the spec's one unit: a published build and a registered
    version (with `<stem>-candidate` on it when its own gates passed)."""
    unit = expand_units(spec)[0]
    folder = tmp_path / f"bundle-{digit}"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(digit.encode() * 64)
    points = [{"scenario": "short", "concurrency": 4, "valid": True, "output_tokens_per_s": tok_s,
               "ttft_ms_p95": 40.0}]
    fields = Manifest(key=digit * 64, key_components={}, model="tiny-chat", unit=unit.name, lane="reference",
                      target={}, variant={}, profile={},
                      source={"uri": spec.model.source, "weights_digest": weights * 64, "tokenizer_digest": "t" * 64},
                      files=[], status=status, status_reason="" if status == "candidate" else "smoke gate: 0.5",
                      smoke={"smoke_agreement": 1.0}, benchmark={"points": points}).model_dump(mode="json")
    fields.pop("files")
    fields.pop("build_id", None)
    published = publish_build(FileStore(spec.publish.store), "tiny-chat", fields, {"bundle": folder},
                              progress=lambda _: None)
    client = MlflowClient(spec.tracking.mlflow_uri)
    exp = client.get_experiment_by_name("rule")
    exp_id = exp.experiment_id if exp else client.create_experiment("rule")
    run_id = client.create_run(exp_id).info.run_id
    return register_published_unit.fn(spec, unit, published.manifest, published.uri, run_id)


def _champion(registry: Registry, stem: str) -> str | None:
    found = registry.version_by_alias("tiny", f"{stem}-champion")
    return str(found.version) if found is not None else None


def test_run_then_rollout_with_the_same_source_promotes_the_candidate(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (stem,) = alias_stems(spec).values()
    version = _register(spec, tmp_path, "1")
    registry = Registry(spec.tracking.mlflow_uri)
    assert str(registry.version_by_alias("tiny", candidate_alias(stem)).version) == version
    assert _champion(registry, stem) is None

    # The rollout that follows finds the same source (no build) and still decides on the candidate.
    (decision,) = decide_promotions(spec, registry, PromotionPolicy())
    assert decision.action == "promoted", decision.reasons
    assert (decision.stem, decision.candidate_version, decision.champion_before) == (stem, version, None)
    assert decision.move is not None and decision.move.action == "promoted"
    assert _champion(registry, stem) == version
    assert registry.version("tiny", version).tags[mltags.PROMOTED_AT]
    assert decision.serving_uri is None  # the published bundle carries no serving/serve.sh

    # A rebuild of the same weights that is as good (one sample each: no gain beyond noise) is held as
    # inconclusive (issue 33: a toolchain bump is promoted for a gain, not for the load of the moment).
    rebuild = _register(spec, tmp_path, "4")
    (same,) = decide_promotions(spec, registry, PromotionPolicy())
    assert (same.action, same.candidate_version) == ("held", rebuild)
    assert same.reasons[0] == "inconclusive: the difference is within noise", same.reasons
    assert _champion(registry, stem) == version
    # A later candidate from a new checkpoint that is as good replaces it; the old champion becomes the previous.
    newer = _register(spec, tmp_path, "2", weights="x")
    (second,) = decide_promotions(spec, registry, PromotionPolicy())
    assert (second.action, second.candidate_version, second.champion_before) == ("promoted", newer, version)
    assert any("output tok/s" in r for r in second.reasons)  # compared with the champion, gate by gate
    assert str(registry.version_by_alias("tiny", f"{stem}-previous-champion").version) == version

    # After a rollback the candidate is newer than the champion again, but a version rolled back from only
    # returns by hand: the next scheduled rollout must not undo the rollback.
    registry.rollback("tiny", stem)
    (after,) = decide_promotions(spec, registry, PromotionPolicy())
    assert (after.action, after.candidate_version, after.champion_before) == ("held", newer, version)
    assert "rolled back from" in after.reasons[0] and after.move is None
    assert _champion(registry, stem) == version


def test_a_champion_that_is_the_newest_candidate_is_held_as_nothing_new(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (stem,) = alias_stems(spec).values()
    version = _register(spec, tmp_path, "1")
    registry = Registry(spec.tracking.mlflow_uri)
    registry.promote("tiny", stem, version, "first")
    history = registry.client.get_registered_model("tiny").tags[mltags.CHAMPION_HISTORY.format(stem=stem)]

    (decision,) = decide_promotions(spec, registry, PromotionPolicy())
    assert decision.action == "held"
    assert decision.reasons == [f"nothing new: candidate v{version} already is the champion"]
    assert decision.move is None  # no registry move, so the task emits no promotion event
    assert _champion(registry, stem) == version
    assert registry.client.get_registered_model("tiny").tags[mltags.CHAMPION_HISTORY.format(stem=stem)] == history


def test_a_worse_candidate_is_held_and_a_rejected_unit_is_never_promoted(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (stem,) = alias_stems(spec).values()
    registry = Registry(spec.tracking.mlflow_uri)
    first = _register(spec, tmp_path, "1")
    registry.promote("tiny", stem, first, "first")
    slow = _register(spec, tmp_path, "2", tok_s=10.0, weights="x")
    (held,) = decide_promotions(spec, registry, PromotionPolicy())
    assert (held.action, held.candidate_version) == ("held", slow)
    assert held.reasons and "output tok/s 10.0 (one sample) vs champion 100.0 (one sample)" in held.reasons[0]
    # A rejected unit gets no candidate alias; even pointed at it by hand, the rule refuses it.
    rejected = _register(spec, tmp_path, "3", status="rejected")
    registry.client.set_registered_model_alias("tiny", candidate_alias(stem), rejected)
    (refused,) = decide_promotions(spec, registry, PromotionPolicy())
    assert refused.action == "held" and "unit is rejected" in refused.reasons[0]
    assert _champion(registry, stem) == first
