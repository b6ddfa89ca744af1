"""Registration of a published unit is idempotent, and a cache hit repairs a missing registration or
alias, against the real MLflow server of the `stack` fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry import tracking_tags as mltags
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.registration import candidate_alias_of, ensure_registered, find_registered, version_tags
from enginefoundry.records.run_records import record_hit, start_parent, tracker_for
from enginefoundry.spec import load_spec
from enginefoundry.store.manifest import Manifest
from enginefoundry.store.publish import PublishedBuild, build_manifest_key

pytestmark = pytest.mark.services
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(stack: dict[str, str], unique: str):
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    spec = spec.model_copy(update={
        "tracking": spec.tracking.model_copy(update={"mlflow_uri": stack["MLFLOW_TRACKING_URI"],
                                                     "experiment": f"repair-{unique}",
                                                     "registered_model": f"repair-{unique}"})})
    unit = expand_units(spec)[0]
    tracker = tracker_for(spec)
    return spec, unit, tracker


def _published(unique: str, n: int = 1) -> PublishedBuild:
    key = f"{unique}{n:054d}"
    build_id = "20260101T000000000000Z-repair"
    manifest = Manifest(key=key, build_id=build_id, key_components={}, model="tiny-chat", unit="fp32-tp1.chat.cpu",
                        lane="reference", target={}, variant={}, profile={}, source={"uri": "local", "revision": None},
                        files=[], status="candidate", versions={"torch": "2"})
    return PublishedBuild(model="tiny-chat", key=key, build_id=build_id, layout="cas",
                          store_uri="s3://enginefoundry/repair",
                          manifest_key=build_manifest_key("tiny-chat", key, build_id), manifest_sha256="0" * 64,
                          manifest=manifest)


def _register(tracker, spec, unit, hit, run: str):
    """As a fresh build registers: its version tags, its candidate alias moved to it."""
    return ensure_registered(tracker, spec, unit=unit, manifest=hit.manifest,
                             manifest_uri=hit.uri, run_id=run,
                             tags=version_tags(spec, unit, hit.manifest, hit.uri, f"runs:/{run}", {}),
                             move_alias=True)


def test_registration_is_idempotent(setup, unique: str):
    spec, unit, tracker = setup
    hit = _published(unique)
    run = tracker.start_run("u", {})
    first = _register(tracker, spec, unit, hit, run)
    again = _register(tracker, spec, unit, hit, run)
    assert first.created and first.alias == candidate_alias_of(spec, unit, hit.manifest) and first.alias_set
    assert not again.created and again.version == first.version and not again.alias_set
    versions = tracker.client.search_model_versions(f"name = '{spec.registered_model_name}'")
    assert [v.version for v in versions] == [first.version]


def test_cache_hit_repairs_a_missing_registration_and_alias(setup, unique: str):
    spec, unit, tracker = setup
    model = spec.registered_model_name
    hit = _published(unique)
    alias = candidate_alias_of(spec, unit, hit.manifest)
    parent = start_parent(tracker, spec, {"uri": "local", "weights_digest": "w", "tokenizer_digest": "t"}, {})

    # Published while MLflow was unreachable: never registered. The next run's hit registers and aliases it.
    outcome = record_hit(tracker, spec, unit, hit.manifest.key, hit, parent)
    registered = find_registered(tracker.client, model, hit.uri)
    assert outcome.cache_hit and registered is not None
    assert tracker.client.get_model_version_by_alias(model, alias).version == registered.version
    assert tracker.client.get_run(outcome.mlflow_run_id).data.tags[mltags.REGISTRY_REPAIRED]

    # The alias deleted by hand: the next hit puts it back, on the same version.
    tracker.client.delete_registered_model_alias(model, alias)
    record_hit(tracker, spec, unit, hit.manifest.key, hit, parent)
    assert tracker.client.get_model_version_by_alias(model, alias).version == registered.version

    # The version deleted: the next hit registers the unit again and points the alias at it.
    tracker.client.delete_model_version(model, registered.version)
    record_hit(tracker, spec, unit, hit.manifest.key, hit, parent)
    again = find_registered(tracker.client, model, hit.uri)
    assert again is not None and again.version != registered.version
    assert tracker.client.get_model_version_by_alias(model, alias).version == again.version

    # A hit restores a missing alias only: it never takes the alias from another existing version.
    newer = _published(unique, 2)
    run = tracker.start_run("newer", {})
    moved = _register(tracker, spec, unit, newer, run)
    record_hit(tracker, spec, unit, hit.manifest.key, hit, parent)
    assert tracker.client.get_model_version_by_alias(model, alias).version == moved.version


class _Racing:
    """The tracker's client, with another run of the spec acting once at the worst moment: `before` runs just before
    the named call's first use (a real registration through the real client), so this run read the registry before
    the other one wrote to it."""

    def __init__(self, client, name: str, before) -> None:
        self._client, self._name, self._before = client, name, before

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name != self._name or self._before is None:
            return attr

        def call(*args, **kwargs):
            act, self._before = self._before, None
            return act(attr, *args, **kwargs)

        return call


def test_two_runs_registering_one_unit_at_once_leave_one_version(setup, unique: str, monkeypatch):
    """Two runs of one spec register the same published unit at once (three concurrent runs: one builds, two take
    its build as a hit): each read "not registered" before either wrote. The later version is withdrawn, both
    runs answer with the first, and the alias points at it."""
    spec, unit, tracker = setup
    hit = _published(unique)
    other_run, run = tracker.start_run("other", {}), tracker.start_run("u", {})
    real = tracker.client
    others: list = []

    def other_registers_first(search, *args, **kwargs):
        before = search(*args, **kwargs)
        others.append(_register(tracker, spec, unit, hit, other_run))  # through the real client: acts once
        return before  # what this run read: not yet registered

    monkeypatch.setattr(tracker, "client", _Racing(real, "search_model_versions", other_registers_first))
    mine = _register(tracker, spec, unit, hit, run)
    model = spec.registered_model_name
    assert others and others[0].created
    assert mine.version == others[0].version and not mine.created
    assert [v.version for v in real.search_model_versions(f"name = '{model}'")] == [mine.version]
    alias = candidate_alias_of(spec, unit, hit.manifest)
    assert real.get_model_version_by_alias(model, alias).version == mine.version and mine.alias == alias


def test_an_alias_set_by_another_run_in_between_is_taken_as_set(setup, unique: str, monkeypatch):
    """The alias write collides with another run's write of the same alias (CI: `UNIQUE constraint failed:
    registered_model_aliases` on SQLite, whose upsert reads then inserts): this run reads the alias again and, as it
    points at this version, answers with it instead of failing the run."""
    from mlflow.exceptions import MlflowException

    spec, unit, tracker = setup
    hit = _published(unique)
    model, alias = spec.registered_model_name, candidate_alias_of(spec, unit, hit.manifest)
    run = tracker.start_run("u", {})
    real = tracker.client

    def other_sets_it_first(set_alias, name, alias_name, version):
        real.set_registered_model_alias(name, alias_name, version)
        raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: registered_model_aliases.name")

    monkeypatch.setattr(tracker, "client", _Racing(real, "set_registered_model_alias", other_sets_it_first))
    mine = _register(tracker, spec, unit, hit, run)
    assert mine.created and mine.alias == alias and not mine.alias_set
    assert real.get_model_version_by_alias(model, alias).version == mine.version
