"""The catalog (enginefoundry/catalog/): every enum value has a complete row, every kind of store scheme a backend,
and a row added to a table reaches its consumers with no other edit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from enginefoundry.bench.costs import hourly_price
from enginefoundry.catalog import (
    GPU_TARGETS,
    PRECISIONS,
    SCHEMES,
    SKUS,
    Arch,
    Precision,
    PrecisionRow,
    Price,
    SchemeKind,
    Sku,
    StoreScheme,
    gpu_target,
    is_store_uri,
    precision_row,
    scheme_of,
)
from enginefoundry.catalog import schemes as schemes_module
from enginefoundry.settings import absolute_store
from enginefoundry.smoke.policy import DEFAULT_POLICIES, family_of
from enginefoundry.spec import Target, load_spec
from enginefoundry.spec.build_spec import channel_uri_problem
from enginefoundry.spec.outputs import PublishSpec
from enginefoundry.store.backends import BACKENDS, FileStore, open_store

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REQUIRED_PRECISION_COLUMNS = ("precision", "rank", "family", "weight_bits", "scale_bytes_per_weight")


@pytest.mark.parametrize("precision", list(Precision))
def test_every_precision_has_a_complete_row(precision: Precision) -> None:
    row = precision_row(precision)
    assert row.precision is precision
    for column in REQUIRED_PRECISION_COLUMNS:
        assert getattr(row, column) is not None, f"{precision.value}: {column} is required"
    assert row.family in DEFAULT_POLICIES  # the gate has a policy for it
    assert family_of(precision.value) is row.family
    assert 0 < row.weight_bytes <= 4
    assert (row.min_cc is None) == (row.min_cc_where is None), "a minimum capability says where it is met"
    # A quantized precision is made by some quantizer (ModelOpt PTQ or convert_checkpoint's weight-only) and is
    # modelled by the predictor or named why not; an unquantized one computes in a torch dtype.
    if row.torch_dtype is None:
        assert row.qformat or row.weight_only_precision, f"{precision.value}: no quantizer makes it"
        assert precision.is_quantized
    else:
        assert not precision.is_quantized


def test_rank_orders_the_gate_families() -> None:
    """A family's precisions share one rank, and a more precise family ranks higher."""
    ranks = {row.family: row.rank for row in PRECISIONS.values()}
    assert all(row.rank == ranks[row.family] for row in PRECISIONS.values())
    assert [ranks[f] for f in DEFAULT_POLICIES] == sorted(ranks.values(), reverse=True)


def test_unknown_precision_names_the_catalog() -> None:
    with pytest.raises(KeyError, match=r"catalog/precisions\.py"):
        precision_row("fp5")


@pytest.mark.parametrize("arch", list(Arch))
def test_every_arch_has_a_target_row(arch: Arch) -> None:
    target = gpu_target(arch.value)
    assert target.arch == arch.value and target.pool
    assert (arch is Arch.CPU) == (target.compute_capability is None)
    assert arch.compute_capability == target.compute_capability
    if target.is_gpu:
        assert target.products, f"{arch.value}: a GPU pool lists its node products"
    assert set(GPU_TARGETS) == {a.value for a in Arch}


def test_every_sku_row_says_something() -> None:
    assert len({s.needle for s in SKUS}) == len(SKUS)
    for sku in SKUS:
        assert sku.needle == sku.needle.lower().strip() and sku.needle
        assert sku.predictor_system or sku.default_price, f"SKU {sku.needle}: no column set"
        if sku.default_price:
            assert sku.default_price.usd_per_hour > 0 and sku.default_price.source


def test_every_scheme_row_is_complete_and_every_kind_has_a_backend() -> None:
    assert set(BACKENDS) == set(SchemeKind)
    for name, row in SCHEMES.items():
        assert row.scheme == name and name.isalnum() and name.islower()
        assert row.store_form.startswith(row.prefix) and row.object_form.startswith(row.prefix)
        assert scheme_of(row.store_form) is row


# --- a new row, no other edit ----------------------------------------------------------------------------------

def test_a_new_object_scheme_reaches_spec_settings_lineage_store_and_channel(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One row for an S3-API store under another scheme name: the spec accepts it (and normalises its prefix), the
    channel check, settings, lineage's "is a store URI" and open_store all follow, with no other edit."""
    row = StoreScheme("minio", SchemeKind.OBJECT, store_form="minio://bucket/prefix", object_form="minio://bucket/key")
    monkeypatch.setitem(SCHEMES, "minio", row)
    assert PublishSpec(store="minio://bucket/a/b/").store == "minio://bucket/a/b"
    with pytest.raises(ValueError, match="has no bucket"):
        PublishSpec(store="minio://")
    with pytest.raises(ValueError, match="minio://bucket/prefix"):
        PublishSpec(store="ftp://bucket")  # the refusal lists the forms the catalog knows
    assert channel_uri_problem("minio://bucket/ch.yaml") is None
    assert "names no object" in (channel_uri_problem("minio://bucket/") or "")
    assert absolute_store("minio://bucket/p", tmp_path) == "minio://bucket/p"
    assert is_store_uri("minio://bucket/p/builds/x")
    store = open_store("minio://bucket/pre", "http://127.0.0.1:9")  # the client is made, nothing is sent
    assert (type(store).__name__, getattr(store, "bucket", None), getattr(store, "prefix", None)) == (
        "S3Store", "bucket", "pre")


def test_a_new_local_scheme_resolves_against_the_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(SCHEMES, "local", StoreScheme("local", SchemeKind.LOCAL, "local://path", "local:///path"))
    assert absolute_store("local://rel/store", tmp_path) == "local://" + str((tmp_path / "rel/store").resolve())
    store = open_store("local://" + str(tmp_path / "s"))
    assert isinstance(store, FileStore) and store.root == (tmp_path / "s").resolve()
    assert "is not absolute" in (channel_uri_problem("local://rel.yaml") or "")
    assert schemes_module.scheme_of("local:///x") is SCHEMES["local"]


def test_a_new_sku_row_reaches_the_predictor_and_the_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """One SKU row: the predictor finds its system and the cost step its default price, with no other edit."""
    from enginefoundry.search.predictor import system_of

    new = Sku("x900", "x900_sxm", Price(9.5, "test row"))
    monkeypatch.setattr("enginefoundry.catalog.gpu_targets.SKUS", (new, *SKUS))
    spec = load_spec(CONFIGS / "tiny-search.yaml")
    target = Target(name="x", arch="sm90", sku=["NVIDIA X900"], gpu_count=2)
    assert system_of(target) == "x900_sxm"
    assert hourly_price(spec, target) == (19.0, "test row")


def test_precision_rows_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRECISIONS[Precision.FP8].rank = 5  # type: ignore[misc]
    assert isinstance(PRECISIONS[Precision.FP8], PrecisionRow)
