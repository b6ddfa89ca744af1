"""One lineage per alias (issue 33): the shipped tiny-cpu and tiny-search no longer share `cpu` of one registered
model, and a lineage is what a rollout keeps (tests/integration/test_alias_lineage_registry.py: the registry
side)."""

from __future__ import annotations

from enginefoundry.inputs.units import expand_units
from enginefoundry.records.alias_lineage import manifest_lineage, unit_lineage
from enginefoundry.records.promotion import alias_stems
from tests.support.shipped_specs import tiny_cpu, tiny_search


def test_the_shipped_cpu_specs_take_distinct_aliases() -> None:
    cpu, search = tiny_cpu(), tiny_search()
    cpu_stems = {(cpu.registered_model_name, s) for s in alias_stems(cpu).values()}
    search_stems = {(search.registered_model_name, s) for s in alias_stems(search).values()}
    assert cpu_stems == {("tiny-chat", "cpu")}  # `make demo`'s aliases are unchanged
    assert not cpu_stems & search_stems, (cpu_stems, search_stems)
    # And they are two lineages: a searched unit is the search's question, not tiny-cpu's profile.
    (cpu_unit,), (search_unit,) = expand_units(cpu), expand_units(search)
    assert unit_lineage(cpu, cpu_unit).digest != unit_lineage(search, search_unit).digest


def test_a_lineage_is_what_a_rollout_keeps() -> None:
    spec = tiny_cpu()
    (unit,) = expand_units(spec)
    mine = unit_lineage(spec, unit)
    # A new source or toolchain is the same lineage.
    moved = spec.model_copy(update={"model": spec.model.model_copy(update={"source": "hf://org/other@main"}),
                                    "toolchain": spec.toolchain.model_copy(update={"trtllm_version": "1.2.0"})})
    assert unit_lineage(moved, expand_units(moved)[0]).digest == mine.digest
    # Another profile is another lineage.
    profile = unit.profile.model_copy(update={"max_batch_size": 8})
    other = spec.model_copy(update={"profiles": [profile]})
    assert unit_lineage(other, expand_units(other)[0]).digest != mine.digest
    # A published unit's key components give the same digest (versions registered before the tag existed).
    from enginefoundry.inputs.units import SourceDigests, toolchain_identity, unit_key_components

    components = unit_key_components(spec, unit, SourceDigests(weights="w" * 64, tokenizer="t" * 64),
                                     toolchain_identity(spec, {"torch": "2"}), spec.lane_options)
    assert manifest_lineage(components) == mine.digest
    assert manifest_lineage({"lane": "reference"}) is None
