"""Signed builds in the real MLflow server of the `stack` fixture: the run and the model version carry the
signer and each attestation's digest; promotion (by hand and rollout's rule) refuses an unsigned candidate when
signatures are required; the private key appears in no MLflow record."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.cli import main
from enginefoundry.evidence.attest import TAG_DIGEST, TAG_SIGNATURE, TAG_SIGNER_KEY_ID, read_index, sign_published
from enginefoundry.evidence.signing import ENV_KEY, keygen, signer_from_env
from enginefoundry.inputs.units import expand_units, key_of
from enginefoundry.records.promotion import PromotionPolicy, Registry, decide, decide_promotions, unit_alias_stem
from enginefoundry.records.run_records import tracker_for
from enginefoundry.spec import load_spec
from enginefoundry.store.backends import S3Store
from enginefoundry.store.publish import publish_build, read_build
from enginefoundry.tasks.track import register_published_unit

pytestmark = pytest.mark.services
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(stack: dict[str, str], s3_env, unique: str, tmp_path):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    spec = spec.model_copy(update={
        "tracking": spec.tracking.model_copy(update={"mlflow_uri": stack["MLFLOW_TRACKING_URI"],
                                                     "experiment": f"sign-{unique}",
                                                     "registered_model": f"sign-{unique}"}),
        "publish": spec.publish.model_copy(update={"store": f"s3://enginefoundry/sign-{unique}"})})
    return spec, expand_units(spec)[0], tracker_for(spec), S3Store(spec.publish.store), keygen(tmp_path / "ci")


def _publish_and_register(spec, unit, tracker, store, tmp_path: Path, tag: str, signer):
    root = tmp_path / tag
    root.mkdir()
    (root / "weights.bin").write_bytes(tag.encode() * 1000)
    comps = {"unit": unit.name, "tag": tag}
    fields = dict(key=key_of(comps), key_components=comps, model=spec.model.name, unit=unit.name, lane="reference",
                  target={}, variant={}, profile={},
                  source={"uri": "hf://org/tiny@abc", "weights_digest": "1" * 64, "tokenizer_digest": "2" * 64},
                  status="candidate",
                  smoke={"smoke_agreement": 0.98})
    result = publish_build(store, spec.model.name, fields, {"bundle": root}, progress=lambda _: None)
    sign_published(store, spec.model.name, result.manifest.key, result.build_id, signer, progress=lambda _: None)
    run_id = tracker.start_run(f"unit-{tag}", {})
    tracker.end_run(run_id, True)
    version = register_published_unit.fn(spec, unit, result.manifest, result.uri, run_id)
    return result, run_id, version


def _strict_spec_file(tmp_path: Path, pub: Path) -> Path:
    """configs/tiny-cpu.yaml with its inputs absolute and publish.require_signature + trusted_keys set."""
    import yaml

    configs = REPO / "configs"
    doc = yaml.safe_load((configs / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str((configs / doc["model"]["source"]).resolve())
    doc["smoke"]["prompts"] = str((configs / doc["smoke"]["prompts"]).resolve())
    doc["publish"] = {"store": f"file://{tmp_path / 'unused-store'}", "require_signature": True,
                      "trusted_keys": [str(pub)]}
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_mlflow_records_signer_and_digests_and_promotion_requires_signatures(setup, tmp_path, monkeypatch, capsys):
    spec, unit, tracker, store, (key, pub) = setup
    model, stem = spec.registered_model_name, unit_alias_stem(spec, unit)
    pem = key.read_text()
    monkeypatch.setenv(ENV_KEY, pem)
    signed, run_id, v1 = _publish_and_register(spec, unit, tracker, store, tmp_path, "a", signer_from_env())

    index = read_index(store, read_build(store, spec.model.name, signed.manifest.key, signed.build_id))
    version = tracker.client.get_model_version(model, v1)
    run = tracker.client.get_run(run_id)
    for tags in (version.tags, run.data.tags):
        assert tags[TAG_SIGNATURE] == "signed" and tags[TAG_SIGNER_KEY_ID] == index.signer.key_id
        for entry in index.attestations:
            assert tags[TAG_DIGEST.format(kind=entry.kind)] == f"sha256:{entry.sha256}"

    # Rollout's rule and `promote` both check signatures when they are required.
    monkeypatch.setenv("ENGINEFOUNDRY_REQUIRE_SIGNATURE", "1")
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(pub))
    registry = Registry(spec.tracking.mlflow_uri)
    first = decide(registry, model, stem, unit.name, PromotionPolicy())
    assert first.action == "promoted", first.reasons

    monkeypatch.delenv(ENV_KEY)
    _, _, v2 = _publish_and_register(spec, unit, tracker, store, tmp_path, "b", signer_from_env())
    assert tracker.client.get_model_version(model, v2).tags[TAG_SIGNATURE] == "unsigned"
    held = decide(registry, model, stem, unit.name, PromotionPolicy())
    assert held.action == "held" and any("UNSIGNED" in r for r in held.reasons), held.reasons
    monkeypatch.delenv("ENGINEFOUNDRY_REQUIRE_SIGNATURE")
    monkeypatch.delenv("ENGINEFOUNDRY_TRUSTED_KEYS")
    # The spec's policy alone (no environment, no flag): rollout's rule and `promote --spec` refuse too.
    strict = spec.publish.model_copy(update={"require_signature": True, "trusted_keys": [str(pub)]})
    held = decide_promotions(spec.model_copy(update={"publish": strict}), registry, PromotionPolicy())[0]
    assert held.action == "held" and any("UNSIGNED" in r for r in held.reasons), held.reasons
    capsys.readouterr()
    code = main(["promote", model, "--target", stem, "--spec", str(_strict_spec_file(tmp_path, pub)),
                 "--mlflow-uri", spec.tracking.mlflow_uri])
    err = capsys.readouterr().err
    assert code == 1 and "promote refused" in err and "UNSIGNED" in err, err
    code = main(["promote", model, "--target", stem, "--require-signature", "--trusted-key", str(pub),
                 "--mlflow-uri", spec.tracking.mlflow_uri])
    err = capsys.readouterr().err
    assert code == 1 and "promote refused" in err and "UNSIGNED" in err, err
    assert registry.version_by_alias(model, f"{stem}-champion").version == v1

    # The signed build is promoted by hand under the same requirement; lineage shows signer and verdict.
    assert main(["promote", model, "--target", stem, "--version", v1, "--require-signature", "--trusted-key",
                 str(pub), "--mlflow-uri", spec.tracking.mlflow_uri]) == 0
    monkeypatch.setenv("ENGINEFOUNDRY_TRUSTED_KEYS", str(pub))
    assert main(["lineage", f"models:/{model}/{v1}", "--mlflow-uri", spec.tracking.mlflow_uri]) == 0
    out = capsys.readouterr().out
    assert "signed by ci (" in out and "verified" in out, out

    # The secret is in no MLflow record: runs (tags, params), versions, the registered model.
    secret = pem.splitlines()[1]
    records = [str(tracker.client.get_registered_model(model).tags)]
    for v in tracker.client.search_model_versions(f"name = '{model}'"):
        records.append(str(v.tags) + str(v.source))
    for r in tracker.client.search_runs([tracker.client.get_experiment_by_name(spec.tracking.experiment)
                                         .experiment_id]):
        records.append(str(r.data.tags) + str(r.data.params))
    assert len(records) >= 3 and not any(secret in rec for rec in records)
