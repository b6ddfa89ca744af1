"""One alias rule (promotion.alias_stems) for registration, promote and rollout; with two profiles per target
each unit gets its own `<stem>-candidate`, and the model version carries what an auditor asks first."""

from __future__ import annotations

from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.promotion import Registry, alias_stems, candidate_alias, champion_alias
from enginefoundry.spec import load_spec
from enginefoundry.store.manifest import Manifest
from enginefoundry.tasks.track import register_published_unit

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path):
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    long = {**data["profiles"][0], "name": "long", "max_input_len": 192}
    data["profiles"].append(long)
    data["targets"].append({"name": "cpu2", "arch": "cpu", "gpu_count": 0})
    data["variants"][0]["targets"] = ["cpu"]
    data["variants"].append({"precision": "bf16", "targets": ["cpu2"]})
    data["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "tiny"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_spec(path)


def test_stems_depend_on_the_spec_and_separate_profiles_of_one_target(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    stems = alias_stems(spec)
    by_target: dict[str, set[str]] = {}
    for unit in expand_units(spec):
        by_target.setdefault(unit.target.name, set()).add(stems[unit.name])
    assert len(by_target["cpu"]) == 2, stems  # two profiles: two stems, never one shared `cpu-candidate`
    assert by_target["cpu2"] == {"cpu2-bf16-tp1-chat", "cpu2-bf16-tp1-long"}
    # One unit on a target: the plain `<target>-candidate` convention.
    assert alias_stems(load_spec(REPO / "configs" / "tiny-cpu.yaml")) == {"fp32-tp1.chat.cpu": "cpu"}
    # A run of one target only must not change the rule (it once counted the units of the run).
    assert alias_stems(spec) == stems


def test_registration_promote_and_rollout_share_the_aliases(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    client = MlflowClient(spec.tracking.mlflow_uri)
    exp = client.create_experiment("alias")
    units = [u for u in expand_units(spec) if u.target.name == "cpu"]
    versions = {}
    for i, unit in enumerate(units):
        run_id = client.create_run(exp).info.run_id
        manifest = Manifest(
            key=f"{i}" * 64, key_components={"toolchain": {"image": "img", "image_digest": "sha256:abc"}},
            model="tiny-chat", unit=unit.name, lane="reference", target={}, variant={}, profile={},
            source={"uri": "hf://org/m@main", "revision": "c" * 40, "weights_digest": "w" * 64,
                    "tokenizer_digest": "t" * 64},
            versions={"torch": "2.13.0"}, files=[], status="candidate", prompts_digest="p" * 64,
            smoke={"smoke_agreement": 1.0},
            benchmark={"slo": [{"scenario": "short", "best_concurrency": 4, "output_tokens_per_s": 321.0}]})
        versions[unit.name] = register_published_unit.fn(spec, unit, manifest, f"file:///store/{i}/manifest.json",
                                                          run_id)
    stems = alias_stems(spec)
    registry = Registry(spec.tracking.mlflow_uri)
    for unit in units:
        got = registry.version_by_alias("tiny", candidate_alias(stems[unit.name]))
        assert got is not None and str(got.version) == versions[unit.name]
        tags = got.tags
        assert tags[mltags.WEIGHTS_DIGEST] == "w" * 64 and tags[mltags.SOURCE_REVISION] == "c" * 40
        assert tags[mltags.GATE_VERDICT].startswith("candidate") and tags[mltags.BEST_OUTPUT_TPS] == "321.0"
        assert tags[mltags.TOOLCHAIN_IMAGE] == "img@sha256:abc" and tags[mltags.ALIAS_STEM] == stems[unit.name]
        assert tags[mltags.MANIFEST_URI].endswith("manifest.json") and tags[mltags.RUN_URL]
        assert all(k.startswith((mltags.NAMESPACE, "mlflow.")) for k in tags)
        # What `promote --target <stem>` and rollout move: the champion alias of the same stem.
        registry.promote("tiny", stems[unit.name], versions[unit.name], "test")
        assert str(registry.version_by_alias("tiny", champion_alias(stems[unit.name])).version) == versions[unit.name]
    assert "cpu-candidate" not in client.get_registered_model("tiny").aliases
    tracker_exp = client.get_experiment_by_name(spec.tracking.experiment).experiment_id
    models = client.search_logged_models(experiment_ids=[tracker_exp])
    assert models and all(str(m.status).endswith("READY") for m in models)  # never left Pending
