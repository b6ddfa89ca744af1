"""Issue 36: the rollout's source-change check covers each LoRA adapter beside the base (no Prefect, no registry):
an adapter probed as `run` fetches it, compared with the lineage its units recorded (merge: one adapter a unit;
serve: the served set), and the change named "adapter <name>: <old> → <new>" on that adapter's units alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import InputError
from enginefoundry.inputs.adapters import ADAPTER_CONFIG, adapter_lineage
from enginefoundry.inputs.sources import fetch
from enginefoundry.records.promotion import same_weights
from enginefoundry.rollout.source_change import (
    Baseline,
    ChangeReport,
    SourceState,
    adapter_differs,
    adapter_states,
    recorded_adapters,
    source_state,
    target_change,
    units_change,
)
from enginefoundry.schemas.manifest import SourcePart
from enginefoundry.spec import SourceKind, load_spec
from enginefoundry.store.manifest import Manifest
from tests.support.adapters import ADAPTERS, set_dropout
from tests.support.paths import CONFIGS, TINY_MODEL


@pytest.fixture
def two_adapters(tmp_path: Path):
    """configs/tiny-lora.yaml with plus-one and a copy of it, `retrained`; the base and both adapters as `run`
    fetched them, and each merged unit's recorded source (what its manifest says it was built from)."""
    retrained = tmp_path / "retrained"
    shutil.copytree(ADAPTERS / "plus-one", retrained)
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["model"]["source"] = str(TINY_MODEL)
    data["model"]["adapters"] = [{"name": "plus-one", "source": str(ADAPTERS / "plus-one")},
                                 {"name": "retrained", "source": str(retrained)}]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(tmp_path / "spec.yaml")
    base = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None)
    fetched = {a.name: fetch(a.parsed_source(spec.base_path), progress=lambda _: None, marker=ADAPTER_CONFIG)
               for a in spec.model.adapters}
    # what merged_source records (inputs/adapters.py), without merging: the merged folder is not read here
    recorded = {}
    for name, snap in fetched.items():
        recorded[name] = SourcePart.model_validate({
            "uri": base.uri, "kind": base.kind.value, "weights_digest": "derived-" + snap.weights_digest,
            "tokenizer_digest": base.tokenizer_digest,
            "identity": {**base.identity, "base_weights_digest": base.weights_digest,
                         "adapter": adapter_lineage(name, snap)}})
    return spec, retrained, fetched, recorded


def baseline(source: SourcePart, alias: str = "cpu-plus-one-champion", version: str = "1") -> Baseline:
    return Baseline(target="cpu", version=version, alias=alias, manifest_uri="file:///m.json", source=source)


def test_an_adapter_probed_as_run_fetches_it_and_a_new_revision_named(two_adapters) -> None:
    spec, retrained, fetched, recorded = two_adapters
    states = adapter_states(spec)
    assert list(states) == ["plus-one", "retrained"]
    assert states["retrained"].weights_digest == fetched["retrained"].weights_digest  # the digest `run` keys on
    state = source_state(spec.model.parsed_source(spec.base_path))
    # Nothing new: each merged unit's base (its base_weights_digest, not the derived one) and adapter are the same.
    same = units_change(state, {"retrained": states["retrained"]}, baseline(recorded["retrained"], "cpu-retrained-"
                                                                            "champion", "2"), adapter="retrained")
    assert not same.changed and same.reasons == ["same source as cpu-retrained-champion v2"]

    set_dropout(retrained, 0.1)  # another revision of `retrained`
    states = adapter_states(spec)
    new = fetch(spec.model.adapters[1].parsed_source(spec.base_path), progress=lambda _: None, marker=ADAPTER_CONFIG)
    assert states["retrained"].weights_digest == new.weights_digest != fetched["retrained"].weights_digest
    groups = [units_change(state, {n: states[n]}, baseline(recorded[n], f"cpu-{n}-champion", v), adapter=n)
              for n, v in (("plus-one", "1"), ("retrained", "2"))]
    assert [g.changed for g in groups] == [False, True]
    old, now = fetched["retrained"].weights_digest[:12], new.weights_digest[:12]
    assert groups[1].reasons == [f"adapter retrained: weights {old} → weights {now}"]
    row = target_change("cpu", groups)
    assert row.changed and row.reason == f"adapter retrained: weights {old} → weights {now}"
    assert [a.name for a in row.adapters] == ["retrained"] and row.baseline_version == "1, 2"
    report = ChangeReport(source=state, adapters=states, targets=[row])
    assert report.changed_adapters == ["retrained"]
    assert report.trigger() == f"cpu: adapter retrained: weights {old} → weights {now}"
    assert "+ adapters plus-one weights" in report.describe()


def test_an_adapter_folder_without_its_config_is_refused_naming_its_field(two_adapters) -> None:
    spec, retrained, *_ = two_adapters
    (retrained / ADAPTER_CONFIG).unlink()
    with pytest.raises(InputError, match=r"model\.adapters\.1\.source: .*adapter_config\.json"):
        adapter_states(spec)


def test_hub_and_s3_adapters_compare_commit_and_etags_and_the_served_set_every_adapter() -> None:
    def part(**fields: object) -> SourcePart:
        return SourcePart.model_validate(fields)

    hub = SourceState(uri="hf://org/lora@main", kind=SourceKind.HF, revision="b" * 40)
    # a build pins the branch to its commit: the place is the repo, the commit is compared on its own
    assert adapter_differs("a", hub, part(uri="hf://org/lora@" + "b" * 40, kind="hf", revision="b" * 40)) is None
    change = adapter_differs("a", hub, part(uri="hf://org/lora@main", kind="hf", revision="a" * 40))
    assert change is not None and change.reason() == f"adapter a: {'a' * 12} → {'b' * 12}"
    moved = adapter_differs("a", hub, part(uri="hf://org/other@main", kind="hf", revision="b" * 40))
    assert moved is not None
    assert moved.reason() == "adapter a: hf://org/other@main → hf://org/lora@main (another source)"
    s3 = SourceState(uri="s3://b/lora", kind=SourceKind.S3, objects={"adapter_config.json": "e1",
                                                                     "adapter_model.safetensors": "e3"})
    was = part(uri="s3://b/lora", kind="s3", identity={"objects": {"adapter_config.json": "e1",
                                                                   "adapter_model.safetensors": "e2"}})
    etags = adapter_differs("a", s3, was)
    assert etags is not None and etags.detail == "1 object(s) changed: adapter_model.safetensors"
    assert etags.reason().startswith("adapter a: etags ") and " → etags " in etags.reason()

    # serve mode: the served set's unit recorded every adapter; one changed, one added, one removed
    served = part(uri="file:///base", kind="local", weights_digest="w", tokenizer_digest="t", identity={"adapters": [
        {"name": "a", "uri": "hf://org/lora@main", "kind": "hf", "revision": "a" * 40},
        {"name": "gone", "uri": "file:///gone", "kind": "local", "weights_digest": "g" * 64}]})
    assert list(recorded_adapters(served)) == ["a", "gone"]
    base = SourceState(uri="file:///base", kind=SourceKind.LOCAL, weights_digest="w", tokenizer_digest="t")
    new_one = SourceState(uri="file:///new", kind=SourceKind.LOCAL, weights_digest="n" * 64)
    group = units_change(base, {"a": hub, "new": new_one}, baseline(served, "cpu-champion"))
    assert group.changed and [c.name for c in group.adapters] == ["a", "new", "gone"]
    assert group.reasons[1:] == [f"adapter new: absent → weights {'n' * 12} (added to the served set)",
                                 f"adapter gone: weights {'g' * 12} → removed (no longer in the spec)"]
    # a unit of the base alone records no adapter; a never-built adapter's units are new
    assert recorded_adapters(part(uri="file:///base")) == {}
    first = units_change(base, {"a": hub}, None, adapter="a")
    assert first.changed and first.reasons == ["adapter a: never built: first build"]


def test_a_new_adapter_revision_is_new_weights_not_a_rebuild_of_the_champions() -> None:
    """promotion.same_weights: a merged unit keys the base's digest and its adapter's apart; the adapter's new
    revision is judged as new weights (promoted when not worse), not as a toolchain rebuild that needs a gain."""
    def unit(adapter_digest: str | None) -> Manifest:
        adapter = {"name": "a", "mode": "merge", "weights_digest": adapter_digest} if adapter_digest else None
        return Manifest(key="k", key_components={"weights_digest": "w", "tokenizer_digest": "t", "adapter": adapter},
                        model="m", unit="fp32-tp1+a.chat.cpu", lane="reference", target={}, variant={}, profile={},
                        source={}, files=[], status="candidate")

    assert same_weights(unit("a1"), unit("a1")) and same_weights(unit(None), unit(None))
    assert not same_weights(unit("a2"), unit("a1"))
