"""One recording path (issue 20): the all-hits fast path and the flow make one hit decision
(`cache_plan.check_hits`), and every MLflow call is retried at one layer, the client wrapper
(`tracking.RetryingClient`), with a stated bound: counted here as HTTP requests against a real local server
that answers 503."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import expand_units, key_of
from enginefoundry.planning import cache_plan, noop_run
from enginefoundry.records import tracking
from enginefoundry.spec import load_spec
from enginefoundry.spec.source import SourceKind
from enginefoundry.store.backends import FileStore
from enginefoundry.store.publish import publish_build

REPO = Path(__file__).resolve().parents[2]


def _publish_fake(store: FileStore, model: str, unit: str) -> str:
    components = {"unit": unit}
    key = key_of(components)
    fields = dict(key=key, key_components=components, model=model, unit="u", lane="reference", target={},
                  variant={}, profile={}, source={}, status="candidate", mlflow_run_id="earlier")
    publish_build(store, model, fields, {}, progress=lambda _: None)
    return key


@pytest.fixture
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FileStore, list, list[str]]:
    """A store, three units of tiny-cpu (the first two share one published key) and a log of store lookups."""
    store = FileStore(f"file://{tmp_path}/store")
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    unit = expand_units(spec)[0]
    units = [unit, *(unit.model_copy(update={"target": unit.target.model_copy(update={"name": n})})
                     for n in ("twin", "third"))]
    looked_up: list[str] = []
    real = cache_plan.find_hit

    def counting(store, model, key, *args, **kwargs):
        looked_up.append(key)
        return real(store, model, key, *args, **kwargs)

    monkeypatch.setattr(cache_plan, "find_hit", counting)
    return store, units, looked_up


def test_the_flow_and_the_fast_path_decide_a_run_alike(setting, monkeypatch: pytest.MonkeyPatch) -> None:
    store, units, looked_up = setting
    published = _publish_fake(store, "tiny-chat", "published")
    keys = {units[0].name: published, units[1].name: published, units[2].name: _publish_fake(store, "tiny-chat", "b")}
    checks = list(cache_plan.check_hits(store, "tiny-chat", units, keys, progress=lambda _: None))
    assert [(c.unit.name, c.duplicate_of, c.hit is not None) for c in checks] == [
        (units[0].name, None, True), (units[1].name, units[0].name, False), (units[2].name, None, True)]
    assert looked_up == [published, keys[units[2].name]]  # a key shared by two units is looked up once

    plan = cache_plan.plan_cache("tiny-chat", units, keys, store, progress=lambda _: None)
    assert set(plan.hits) == {units[0].name, units[2].name} and plan.duplicates == {units[1].name: units[0].name}

    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    snapshot = SourceSnapshot(uri="file:///m", kind=SourceKind.LOCAL, local_dir="/m", weights_digest="w" * 64,
                              tokenizer_digest="t" * 64)
    monkeypatch.setattr(noop_run, "expand_units", lambda *_: units)
    monkeypatch.setattr(noop_run, "fetch", lambda *_, **__: snapshot)
    monkeypatch.setattr(noop_run, "unit_keys", lambda *_, **__: cache_plan.UnitKeys(components={}, keys=keys))
    monkeypatch.setattr(noop_run, "open_store", lambda *_: store)
    looked_up.clear()
    fast = noop_run.decide_all_hits(spec.model_copy(update={"model": spec.model.model_copy(
        update={"name": "tiny-chat"})}))
    assert fast is not None and looked_up == [published, keys[units[2].name]]
    assert {u: b.build_id for u, b in fast.hits.items()} == {
        units[0].name: plan.hits[units[0].name].build_id, units[1].name: plan.hits[units[0].name].build_id,
        units[2].name: plan.hits[units[2].name].build_id}

    looked_up.clear()  # a miss: the fast path stops at it, as the flow's plan would lease it there
    keys[units[0].name] = keys[units[1].name] = key_of({"unit": "never published"})
    assert noop_run.decide_all_hits(spec.model_copy(update={"model": spec.model.model_copy(
        update={"name": "tiny-chat"})})) is None
    assert looked_up == [keys[units[0].name]]


def test_a_refusal_is_not_retried() -> None:
    calls: list[str] = []

    class Refusing:
        def get_registered_model(self, name: str) -> None:
            calls.append(name)
            raise PermissionError("403: not allowed")

    with pytest.raises(PermissionError):
        tracking.RetryingClient(Refusing()).get_registered_model("m")
    assert calls == ["m"]


def test_tasks_that_only_record_to_mlflow_carry_no_prefect_retries() -> None:
    from enginefoundry.tasks import promote, track

    tasks = [track.start_parent_run, track.start_unit_run, track.record_unit, track.finish_parent_run,
             track.register_published_unit, track.record_cache_hit, promote.promote_units, promote.compare_rebuilt]
    assert {t.name: t.retries for t in tasks} == {t.name: 0 for t in tasks}
