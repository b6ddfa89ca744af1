"""The streamed cast gives the same tensors as transformers' own cast, and links what it does not cast."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError
from enginefoundry.inputs.checkpoint_cast import cast_checkpoint, read_header

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-chat" / "model"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_equals_transformers_cast(tmp_path: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import load_file

    report = cast_checkpoint(TINY, tmp_path / "out", dtype)
    assert "model.safetensors" in report.written
    ours = load_file(tmp_path / "out" / "model.safetensors")
    source = load_file(TINY / "model.safetensors")
    assert ours.keys() == source.keys()
    for name, tensor in source.items():
        assert ours[name].dtype == getattr(torch, dtype)
        assert torch.equal(ours[name], tensor.to(getattr(torch, dtype))), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == dtype
    # The result loads with transformers and keeps the source's tokenizer bytes.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert next(model.parameters()).dtype == getattr(torch, dtype)
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (TINY / "tokenizer.json").read_bytes()


def test_no_cast_clones_and_never_shares_an_inode_with_the_source(tmp_path: Path) -> None:
    """Issue 21: the work checkpoint was hard links of the user's files, so a write to either reached the other."""
    report = cast_checkpoint(TINY, tmp_path / "out", "float32")  # the fixture is fp32 already
    assert report.written == ["config.json"] and report.bytes_written < 4096
    assert "model.safetensors" in report.cloned
    for name in report.cloned:
        ours, theirs = (tmp_path / "out" / name).stat(), (TINY / name).stat()
        assert ours.st_ino != theirs.st_ino and theirs.st_nlink == 1, name
        assert (tmp_path / "out" / name).read_bytes() == (TINY / name).read_bytes()
        assert ours.st_mode & 0o777 == theirs.st_mode & 0o777


def test_the_header_is_aligned_and_offsets_are_contiguous(tmp_path: Path) -> None:
    cast_checkpoint(TINY, tmp_path / "out", "bfloat16")
    header, start = read_header(tmp_path / "out" / "model.safetensors")
    assert start % 8 == 0
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] == (tmp_path / "out" / "model.safetensors").stat().st_size - start


def test_refuses_a_checkpoint_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(InputError, match="safetensors"):
        cast_checkpoint(tmp_path / "src", tmp_path / "out", "bfloat16")


def test_a_hub_cache_snapshot_of_links_is_cast(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot holds links into blobs/ named by hash, without the .safetensors suffix:
    the cast must still see the shard (it once linked the bf16 bytes as the 'fp32' checkpoint)."""
    import torch
    from safetensors.torch import load_file

    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for i, src in enumerate(sorted(TINY.iterdir())):
        blob = blobs / f"{i:040x}"
        blob.write_bytes(src.read_bytes())
        (snapshot / src.name).symlink_to(blob)
    report = cast_checkpoint(snapshot, tmp_path / "out", "bfloat16")
    assert "model.safetensors" in report.written
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "out" / "model.safetensors").values())


def test_rows_are_cast_a_chunk_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a chunk smaller than one tensor, the result is still every tensor, cast, and memory is one chunk."""
    import torch
    from safetensors.torch import load_file

    import enginefoundry.inputs.checkpoint_cast as cc

    monkeypatch.setattr(cc, "CHUNK_BYTES", 1000)
    report = cast_checkpoint(TINY, tmp_path / "out", "bfloat16")
    assert report.largest_tensor_bytes <= 2 * 1000  # the rows read plus their cast, one chunk at a time
    ours, source = load_file(tmp_path / "out" / "model.safetensors"), load_file(TINY / "model.safetensors")
    assert all(torch.equal(ours[k], v.to(torch.bfloat16)) for k, v in source.items())
