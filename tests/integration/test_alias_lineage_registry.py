"""One lineage per alias (issue 33), against a registry (a local MLflow file: seconds, so not in the unit tier): a spec
whose alias stem another lineage holds is refused with the field and the fix; promotion never compares with nor
replaces another lineage's champion, and `promote --version` refuses it too."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import InputError, SpecError
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.alias_lineage import alias_problems, refuse_alias_collisions, unit_lineage
from enginefoundry.records.promotion import PromotionPolicy, Registry, StemContext, decide
from tests.support.shipped_specs import tiny_cpu, tiny_search


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _register(registry: Registry, model: str, tags: dict[str, str], *aliases: str) -> str:
    client = registry.client
    if not client.search_registered_models(f"name = '{model}'"):
        client.create_registered_model(model)
    version = str(client.create_model_version(model, source="/nowhere",
                                              tags={mltags.STATUS: "candidate", **tags}).version)
    for alias in aliases:
        client.set_registered_model_alias(model, alias, version)
    return version


def test_a_colliding_pair_is_refused_with_the_field_and_the_fix(registry: Registry, tmp_path: Path) -> None:
    """tiny-search as it was (registered into tiny-chat) after tiny-cpu's unit took `cpu`: refused at validate."""
    cpu = tiny_cpu()
    (cpu_unit,) = expand_units(cpu)
    _register(registry, "tiny-chat", unit_lineage(cpu, cpu_unit).tags(), "cpu-champion", "cpu-candidate")
    colliding = tiny_search(registered_model="tiny-chat", mlflow=registry.uri)
    problems = alias_problems(colliding, registry)
    assert len(problems) == 1
    field, message = problems[0]
    assert field == "tracking.registered_model"
    assert "alias cpu-champion of registered model tiny-chat holds version 1 of another unit lineage" in message
    assert "spec tiny-cpu: fp32-tp1.chat.cpu" in message
    assert "tracking.registered_model: tiny-chat-tiny-search" in message  # the fix
    with pytest.raises(SpecError, match="another unit lineage"):
        refuse_alias_collisions(colliding)
    # The same spec's own lineage, and the shipped (distinct) tiny-search, pass.
    assert alias_problems(cpu.model_copy(update={"tracking": colliding.tracking}), registry) == []
    assert alias_problems(tiny_search(mlflow=registry.uri), registry) == []


def test_promotion_never_judges_or_replaces_another_lineage(registry: Registry) -> None:
    cpu, search = tiny_cpu(), tiny_search(registered_model="tiny-chat")
    cpu_lineage = unit_lineage(cpu, expand_units(cpu)[0])
    search_lineage = unit_lineage(search, expand_units(search)[0])
    champion = _register(registry, "tiny-chat", search_lineage.tags(), "cpu-champion")
    candidate = _register(registry, "tiny-chat", cpu_lineage.tags(), "cpu-candidate")
    held = decide(registry, "tiny-chat", "cpu", "fp32-tp1.chat.cpu", PromotionPolicy(),
                  StemContext(lineage=cpu_lineage))
    assert held.action == "held" and held.champion_before is None
    assert f"cpu-champion is version {champion} of another unit lineage (spec tiny-search" in held.reasons[0]
    assert "not compared with and not replaced" in held.reasons[0]
    # The other spec's rollout does not take this spec's candidate for its own.
    other = decide(registry, "tiny-chat", "cpu", search.searched[0].target, PromotionPolicy(),
                   StemContext(lineage=search_lineage))
    assert other.action == "held"
    assert f"cpu-candidate is version {candidate} of another unit lineage (spec tiny-cpu" in other.reasons[0]
    # `promote --version` by hand refuses it too, and the champion stays.
    with pytest.raises(InputError, match="is of another unit lineage than cpu-champion"):
        registry.promote("tiny-chat", "cpu", candidate, "by hand")
    assert str(registry.version_by_alias("tiny-chat", "cpu-champion").version) == champion
