"""Sibling references: which unit judges which, the order of a run, the artifact (keyed by the sibling's unit
key, prompts and generation settings; published once, found from another machine) and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.errors import ReferenceRefused
from enginefoundry.inputs.units import expand_units, key_of
from enginefoundry.records.run_summary import UnitOutcome, refused_by_sibling
from enginefoundry.smoke.prompts import load_prompt_set
from enginefoundry.smoke.reference import (
    ReferenceAnswer,
    ReferenceAsk,
    ReferenceKey,
    ReferenceSettings,
    SiblingReferenceKey,
    load_sibling_reference,
    publish_sibling_reference,
    reference_key,
    sibling_reference_key,
    store_key,
)
from enginefoundry.smoke.sibling import (
    SiblingRef,
    reference_waves,
    serves_as_sibling,
    sibling_reference,
    sibling_refs,
)
from enginefoundry.spec import parse_spec
from enginefoundry.store.backends import open_store
from enginefoundry.store.publish import publish_build
from tests.support.paths import CONFIGS, TINY_MODEL, TINY_PROMPTS

CASES = load_prompt_set(TINY_PROMPTS).cases[:3]
ANSWERS = [ReferenceAnswer(id=c.id, text=c.expected or "", token_ids=[1, 2]) for c in CASES]


def _spec(variants: list[dict[str, Any]], **smoke: Any):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["variants"] = variants
    data["profiles"].append({**data["profiles"][0], "name": "long"})
    data["smoke"].update(smoke)
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _keys(units) -> dict[str, str]:
    return {u.name: key_of({"unit": u.name}) for u in units}


def test_each_unit_is_judged_by_the_sibling_of_its_own_profile_and_target():
    spec = _spec([{"precision": "fp8"}, {"precision": "bf16"}, {"precision": "fp32"}],
                 reference="sibling", reference_sibling="bf16")
    units = expand_units(spec)
    keys = _keys(units)
    refs = sibling_refs(spec, units, keys)
    assert refs == {
        "fp8-tp1.chat.cpu": SiblingRef(unit="bf16-tp1.chat.cpu", key=keys["bf16-tp1.chat.cpu"], precision="bf16"),
        "fp8-tp1.long.cpu": SiblingRef(unit="bf16-tp1.long.cpu", key=keys["bf16-tp1.long.cpu"], precision="bf16"),
    }
    assert [u.name for u in units if serves_as_sibling(spec, u)] == ["bf16-tp1.chat.cpu", "bf16-tp1.long.cpu"]
    assert sibling_refs(_spec([{"precision": "fp8"}, {"precision": "bf16"}]), units, keys) == {}


def test_a_run_orders_siblings_before_the_units_they_judge():
    spec = _spec([{"precision": "fp8"}, {"precision": "fp32"}], reference="sibling", reference_sibling="fp32")
    units = expand_units(spec)  # spec order puts fp8 first
    waves = reference_waves(units, sibling_refs(spec, units, _keys(units)))
    assert [[u.name for u in w] for w in waves] == [["fp32-tp1.chat.cpu", "fp32-tp1.long.cpu"],
                                                    ["fp8-tp1.chat.cpu", "fp8-tp1.long.cpu"]]
    only_dependents = reference_waves(units[:2], sibling_refs(spec, units, _keys(units)))  # siblings are hits
    assert [[u.name for u in w] for w in only_dependents] == [["fp8-tp1.chat.cpu", "fp8-tp1.long.cpu"]]


def test_the_sibling_key_changes_with_what_the_answers_depend_on():
    base = sibling_reference_key("a" * 64, CASES, max_new_tokens=6)
    others = [sibling_reference_key("b" * 64, CASES, max_new_tokens=6),
              sibling_reference_key("a" * 64, CASES[:2], max_new_tokens=6),
              sibling_reference_key("a" * 64, CASES, max_new_tokens=7)]
    assert len({base.digest, *(k.digest for k in others)}) == 4
    source = reference_key(TINY_MODEL, CASES, dtype="fp32", max_new_tokens=6)
    assert base.digest != source.digest and isinstance(source, ReferenceKey)


def test_a_gpu_reference_is_its_own_artifact_and_a_cpu_key_keeps_its_digest():
    cpu = reference_key(TINY_MODEL, CASES, dtype="bf16", max_new_tokens=6)
    gpu = reference_key(TINY_MODEL, CASES, dtype="bf16", max_new_tokens=6, device="gpu")
    assert cpu.device is None and gpu.device == "gpu" and cpu.digest != gpu.digest
    assert "device" not in ReferenceKey.model_validate(cpu.model_dump(exclude_none=True)).model_dump(exclude_none=True)


def test_published_answers_are_found_from_another_machine_and_never_replaced(tmp_path: Path):
    store = open_store(f"file://{tmp_path / 'store'}")
    first = publish_sibling_reference(ANSWERS, unit="fp32-tp1.chat.cpu", unit_key="k" * 64, cases=CASES,
                                      max_new_tokens=6, store=store, cache_dir=tmp_path / "worker1")
    assert isinstance(first.key, SiblingReferenceKey) and store.exists(store_key(first.key))
    changed = [a.model_copy(update={"text": "other"}) for a in ANSWERS]
    again = publish_sibling_reference(changed, unit="fp32-tp1.chat.cpu", unit_key="k" * 64, cases=CASES,
                                      max_new_tokens=6, store=store, cache_dir=tmp_path / "worker3")
    assert again == first  # the first publication stays (published bytes never change)
    found = load_sibling_reference("fp32-tp1.chat.cpu", "k" * 64, ReferenceAsk(CASES, 6),
                                   ReferenceSettings(store=store, cache_dir=tmp_path / "worker2"),
                                   dtype="fp32", model_dir=TINY_MODEL)
    assert found is not None
    ref, outcome = found
    assert ref.answers == ANSWERS and ref.served_by == "fp32-tp1.chat.cpu" and outcome.source == "store"
    assert outcome.label().startswith(f"sibling unit fp32-tp1.chat.cpu (key {'k' * 12}; fp32 served answers "
                                      f"{first.key.digest[:12]}, store, file://")
    assert load_sibling_reference("fp32-tp1.chat.cpu", "k" * 64, ReferenceAsk(CASES, 7),
                                  ReferenceSettings(store=store, cache_dir=tmp_path / "worker2"),
                                  dtype="fp32", model_dir=TINY_MODEL) is None


def _publish_sibling(store, spec, unit_name: str, key: str, status: str, reason: str, tmp_path: Path) -> None:
    folder = tmp_path / "bundle"
    folder.mkdir(exist_ok=True)
    (folder / "f.txt").write_text("x")
    fields = dict(key=key, key_components={"unit": unit_name}, model=spec.model.name, unit=unit_name,
                  lane="reference", target={}, variant={}, profile={}, source={}, status=status,
                  status_reason=reason)
    publish_build(store, spec.model.name, fields, {"bundle": folder}, progress=lambda _: None)


def test_a_rejected_unpublished_or_silent_sibling_refuses_its_dependents_with_the_reason(tmp_path: Path):
    spec = _spec([{"precision": "fp32"}, {"precision": "bf16"}], reference="sibling", reference_sibling="fp32")
    store = open_store(f"file://{tmp_path / 'store'}")
    key = key_of({"unit": "fp32-tp1.chat.cpu"})
    ref = SiblingRef(unit="fp32-tp1.chat.cpu", key=key, precision="fp32")
    with pytest.raises(ReferenceRefused, match=r"sibling unit fp32-tp1.chat.cpu \(key .{12}\), is not published"):
        sibling_reference(ref, spec, CASES, store=store, model_dir=TINY_MODEL, cache_dir=tmp_path / "c")

    _publish_sibling(store, spec, ref.unit, key, "rejected", "task accuracy: 3/20 vs reference 18/20", tmp_path)
    with pytest.raises(ReferenceRefused) as err:
        sibling_reference(ref, spec, CASES, store=store, model_dir=TINY_MODEL, cache_dir=tmp_path / "c")
    assert "was rejected by its own gate (task accuracy: 3/20 vs reference 18/20)" in str(err.value)
    assert "smoke.reference: source" in str(err.value)

    good_key = key_of({"unit": "fp32-tp1.long.cpu"})
    good = SiblingRef(unit="fp32-tp1.long.cpu", key=good_key, precision="fp32")
    _publish_sibling(store, spec, good.unit, good_key, "candidate", "", tmp_path)
    with pytest.raises(ReferenceRefused, match="published no served answers for this prompt set and max_new_tokens"):
        sibling_reference(good, spec, CASES, store=store, model_dir=TINY_MODEL, cache_dir=tmp_path / "c")
    publish_sibling_reference(ANSWERS, unit=good.unit, unit_key=good_key, cases=CASES,
                              max_new_tokens=spec.smoke.max_new_tokens, store=store, cache_dir=tmp_path / "w1")
    answers, outcome = sibling_reference(good, spec, CASES, store=store, model_dir=TINY_MODEL,
                                         cache_dir=tmp_path / "c")
    assert answers.answers == ANSWERS and outcome.sibling_unit == good.unit and outcome.sibling_key == good_key


def test_units_whose_sibling_this_run_rejected_or_failed_are_refused_before_they_run():
    spec = _spec([{"precision": "fp8"}, {"precision": "fp32"}], reference="sibling", reference_sibling="fp32")
    units = expand_units(spec)
    refs = sibling_refs(spec, units, _keys(units))
    built = {
        "fp32-tp1.chat.cpu": UnitOutcome(unit="fp32-tp1.chat.cpu", target="cpu", status="rejected",
                                         reason="smoke gate: task accuracy 3/20 vs reference 18/20"),
        "fp32-tp1.long.cpu": UnitOutcome(unit="fp32-tp1.long.cpu", target="cpu", status="candidate"),
    }
    refused = refused_by_sibling(units, refs, built)
    assert list(refused) == ["fp8-tp1.chat.cpu"]  # the long profile's sibling passed; the siblings judge nothing
    out = refused["fp8-tp1.chat.cpu"]
    assert out.status == "failed" and out.reason.startswith(
        "refused: its reference, sibling unit fp32-tp1.chat.cpu (key ")
    assert "was rejected by its own gate (smoke gate: task accuracy 3/20 vs reference 18/20)" in out.reason
    failed = {"fp32-tp1.chat.cpu": built["fp32-tp1.chat.cpu"].model_copy(update={"status": "failed",
                                                                                   "reason": "build: exit 1"})}
    assert "fp32-tp1.chat.cpu (key " in refused_by_sibling(units, refs, failed)["fp8-tp1.chat.cpu"].reason
    assert "failed (build: exit 1)" in refused_by_sibling(units, refs, failed)["fp8-tp1.chat.cpu"].reason
