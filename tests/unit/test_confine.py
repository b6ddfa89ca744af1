"""Confinement of outside paths and names: hostile relative paths, S3 prefixes, spec names, local symlinks."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from enginefoundry.confine import UnsafePathError, confined_join, normalise_prefix, safe_relpath
from enginefoundry.errors import SourceError, SpecError
from enginefoundry.inputs.sources import _fetch_local, remove_stale_partials
from enginefoundry.spec import SourceKind, SourceURI, parse_source_uri, parse_spec

REPO = Path(__file__).resolve().parents[2]

# Relative paths no file may be written to (S3 keys after the prefix, manifest paths).
HOSTILE_RELPATHS = [
    "../escape.txt", "../../etc/passwd", "a/../../b", "a/..", "..", ".", "./a", "a/./b",
    "/etc/passwd", "//server/share", "a\\..\\..\\b", "..\\escape", "C:/Windows/x", "c:evil",
    "a//b", "a/", "", "a\x00b", "a\nb", "a/\x1b[31mred",
]


@pytest.mark.parametrize("rel", HOSTILE_RELPATHS)
def test_hostile_relative_paths_are_refused(rel: str, tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError) as err:
        confined_join(tmp_path, rel, "S3 object key")
    assert "S3 object key" in str(err.value)
    assert "\n" not in str(err.value)  # one line, even for a key carrying a newline


@pytest.mark.parametrize("rel", ["config.json", "sub/dir/model.safetensors", "a..b/c", "..a", "tokenizer.json"])
def test_plain_relative_paths_pass(rel: str, tmp_path: Path) -> None:
    assert confined_join(tmp_path, rel) == tmp_path / rel
    assert str(safe_relpath(rel)) == rel


def test_a_symlinked_folder_inside_the_root_cannot_lead_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="resolves outside"):
        confined_join(root, "link/x")


@pytest.mark.parametrize("prefix", ["a/../../x", "..", "a/./b", "a\\b", "x/\x00"])
def test_prefix_with_dot_segments_is_refused(prefix: str) -> None:
    with pytest.raises(UnsafePathError):
        normalise_prefix(prefix)


def test_prefix_is_normalised() -> None:
    assert normalise_prefix("//models///tiny/") == "models/tiny"


@pytest.mark.parametrize("uri", ["s3://bucket/../../x", "s3://bucket/a/../b", "s3://bucket/./a", "s3://bucket/a\\b"])
def test_s3_source_prefix_cannot_move_the_cache(uri: str) -> None:
    with pytest.raises(ValueError, match="refused"):
        parse_source_uri(uri)


def test_s3_source_prefix_slashes_collapse() -> None:
    assert parse_source_uri("s3://bucket//models//tiny/").location == "bucket/models/tiny"


def _spec() -> dict:
    return yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())


HOSTILE_NAMES = ["../x", "a/b", "..", "a b", "$(touch PWNED)", "`id`", "a;b", "a\nb", "x" * 200, "-rf", ".hidden"]


@pytest.mark.parametrize(("field", "path"), [
    ("model.name", ("model", "name")),
    ("name", ("name",)),
    ("profiles.0.name", ("profiles", 0, "name")),
    ("targets.0.name", ("targets", 0, "name")),
    ("benchmark.scenarios.0.name", ("benchmark", "scenarios", 0, "name")),
])
@pytest.mark.parametrize("bad", HOSTILE_NAMES)
def test_names_that_become_path_components_are_refused_at_validate_time(field: str, path: tuple, bad: str) -> None:
    data = copy.deepcopy(_spec())
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = bad
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert field in [p for p, _ in err.value.problems]


@pytest.mark.parametrize("store", ["s3://bucket/../../x", "s3://bucket/a/./b", "s3://bucket/a\\b"])
def test_store_prefix_with_dot_segments_is_refused(store: str) -> None:
    data = _spec()
    data.setdefault("publish", {})["store"] = store
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert "publish.store" in [p for p, _ in err.value.problems]


def test_store_prefix_is_normalised() -> None:
    data = _spec()
    data.setdefault("publish", {})["store"] = "s3://bucket//a///b/"
    assert parse_spec(data).publish.store == "s3://bucket/a/b"


def test_local_source_with_a_symlink_out_of_it_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (tmp_path / "secret").write_text("secret")
    (src / "model.safetensors").symlink_to(tmp_path / "secret")
    with pytest.raises(SourceError, match=r"model\.safetensors"):
        _fetch_local(SourceURI(kind=SourceKind.LOCAL, location=str(src)))


def test_local_source_with_a_symlinked_folder_out_of_it_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "etc").symlink_to("/etc")
    with pytest.raises(SourceError, match="etc"):
        _fetch_local(SourceURI(kind=SourceKind.LOCAL, location=str(src)))


def test_local_source_links_inside_it_and_hf_snapshots_are_accepted(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--name"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "f00d").write_text("{}")
    (snap / "config.json").symlink_to(repo / "blobs" / "f00d")
    (snap / "alias.json").symlink_to(snap / "config.json")
    assert _fetch_local(SourceURI(kind=SourceKind.LOCAL, location=str(snap))) == snap.resolve()


def test_stale_partial_downloads_are_removed_live_ones_kept(tmp_path: Path) -> None:
    import os

    dest = tmp_path / "0123abcd"
    dead = tmp_path / "0123abcd.partial-999999999"
    legacy = tmp_path / "0123abcd.partial"
    live = tmp_path / f"0123abcd.partial-{os.getpid()}"
    for d in (dead, legacy, live):
        d.mkdir()
    assert sorted(remove_stale_partials(dest)) == sorted([dead, legacy])
    assert live.is_dir() and not dead.exists() and not legacy.exists()
