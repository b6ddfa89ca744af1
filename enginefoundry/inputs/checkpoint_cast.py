"""Cast a Hugging Face safetensors checkpoint to another dtype, one tensor at a time.

`from_pretrained` + `save_pretrained` holds the whole model in host RAM (280 GB for a 70B model in fp32).
This writes each output shard by streaming: the safetensors header is computed from the source headers
(names, shapes, target dtype), then each tensor is read, cast and written, so peak memory is one tensor,
whatever the model size. Files that need no cast are cloned (`store.clone_or_copy`): a reflink where the
filesystem offers copy-on-write (a conversion that casts nothing then writes no data), an in-kernel copy
elsewhere. Never a hard link: the work checkpoint is written to and published from, and must not share an
inode with the user's checkpoint.

Format: https://github.com/huggingface/safetensors#format (8-byte little-endian header length, a JSON header
with `dtype`, `shape`, `data_offsets` per tensor and an optional `__metadata__`, then the raw bytes,
row-major, little-endian).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel

from enginefoundry.errors import InputError
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import JsonObject
from enginefoundry.store.backends import clone_or_copy

# safetensors dtype names of the floating types a cast may change; integer and bool tensors are kept.
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
TORCH_TO_SAFETENSORS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
CHUNK_BYTES = 64 * 2**20  # rows of a tensor cast and written at a time
ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


Header = dict[str, JsonObject]
"""A safetensors header: tensor name (or "__metadata__") → {"dtype", "shape", "data_offsets"} (the format's JSON)."""
MAX_HEADER_BYTES = 100 * 2**20


class CastReport(BaseModel):
    """What a cast did: files cloned from the source unchanged, files written (cast), and bytes of each."""

    cloned: list[str]
    written: list[str]
    bytes_cloned: int
    bytes_written: int
    largest_tensor_bytes: int


def read_header(path: Path) -> tuple[Header, int]:
    """The JSON header of a safetensors file and the offset where its data starts."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise InputError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise InputError(f"{path} is not a safetensors file (header length {length})")
        try:
            header = parse_json(f.read(length), what=f"{path}'s header", max_bytes=MAX_HEADER_BYTES)
        except DocumentError as err:
            raise InputError(f"{err}: not a safetensors file") from None
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
        raise InputError(f"{path} is not a safetensors file (its header is not an object of objects)")
    return header, 8 + length


def needs_cast(header: Header, target: str) -> bool:
    return any(isinstance(v, dict) and v.get("dtype") in FLOAT_DTYPES and v["dtype"] != target
               for k, v in header.items() if k != "__metadata__")


def cast_file(src: Path, dest: Path, target: str) -> int:
    """Write `src` with every floating tensor cast to `target` (a safetensors dtype name); return the largest
    chunk written in bytes (the peak memory this needed beyond the interpreter: rows of one tensor).

    Bytes are read with plain reads at the header's offsets, not through a memory map: mapped pages of a
    multi-GB shard would count as resident memory of this process however little it holds at once."""
    header, data_start = read_header(src)
    names = sorted(k for k in header if k != "__metadata__")
    blob = _cast_header(header, names, target)
    tmp = dest.with_name(f".{dest.name}.partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    largest = 0
    try:
        with tmp.open("wb") as out, src.open("rb") as f:
            out.write(struct.pack("<Q", len(blob)))
            out.write(blob)
            for name in names:
                largest = max(largest, _cast_tensor(f, out, src, header, name, data_start, target))
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return largest


def _cast_header(header: Header, names: list[str], target: str) -> bytes:
    """The cast file's header (its tensors in `names` order, floating ones as `target`), padded to 8 bytes."""
    out_header: Header = {}
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    offset = 0
    for name in names:
        entry = header[name]
        dtype = target if entry["dtype"] in FLOAT_DTYPES else entry["dtype"]
        count = 1
        for dim in entry["shape"]:
            count *= dim
        size = count * ITEM_SIZE[dtype]
        out_header[name] = {"dtype": dtype, "shape": entry["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(out_header, separators=(",", ":")).encode()
    return blob + b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the reference writer does


def _cast_tensor(f: BinaryIO, out: BinaryIO, src: Path, header: Header, name: str, data_start: int,
                 target: str) -> int:
    """One tensor of `src` (open as `f`) written to `out`, cast to `target` when floating; the largest chunk."""
    import torch

    entry = header[name]
    torch_dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                    "U8": torch.uint8, "BOOL": torch.bool}
    shape = entry["shape"]
    cast = entry["dtype"] in FLOAT_DTYPES
    # Rows at a time: memory stays at CHUNK_BYTES even for a 128k × 8k embedding.
    row_items = 1
    for dim in shape[1:]:
        row_items *= dim
    in_row = row_items * ITEM_SIZE[entry["dtype"]]
    out_row = row_items * ITEM_SIZE[target if cast else entry["dtype"]]
    n_rows = shape[0] if shape else 1
    step = max(1, CHUNK_BYTES // max(1, out_row, in_row))
    begin = data_start + entry["data_offsets"][0]
    largest = 0
    for first in range(0, n_rows, step):
        rows = min(step, n_rows - first)
        f.seek(begin + first * in_row)
        raw = f.read(rows * in_row)
        if len(raw) != rows * in_row:
            raise InputError(f"{src} is truncated: tensor {name} ends past the file")
        if not raw:
            continue
        chunk = torch.frombuffer(bytearray(raw), dtype=torch_dtypes[entry["dtype"]])
        if cast:
            chunk = chunk.to(torch_dtypes[target])
        view = chunk.view(torch.uint8).numpy()
        largest = max(largest, view.nbytes + len(raw))
        out.write(view.data)
        del raw, chunk, view
    return largest


def cast_checkpoint(source: Path, dest: Path, torch_dtype: str) -> CastReport:
    """Copy a Hugging Face checkpoint folder to `dest` with its floating weights in `torch_dtype`
    (`float32`, `float16`, `bfloat16`). Safetensors shards that already hold that dtype, and every other
    file, are cloned (never hard-linked); `config.json` gets the new dtype. Refuses checkpoints without safetensors."""
    target = TORCH_TO_SAFETENSORS.get(torch_dtype)
    if target is None:
        raise InputError(f"cannot cast to {torch_dtype}: use one of {', '.join(TORCH_TO_SAFETENSORS)}")
    shards = sorted(source.glob("*.safetensors"))
    if not shards:
        raise InputError(f"{source} has no *.safetensors weights; convert the checkpoint to safetensors first")
    dest.mkdir(parents=True, exist_ok=True)
    report = CastReport(cloned=[], written=[], bytes_cloned=0, bytes_written=0, largest_tensor_bytes=0)
    for entry in sorted(p for p in source.iterdir() if p.is_file()):
        # A Hugging Face cache snapshot holds links into its blobs/ folder: clone the bytes, not the link.
        path, out = entry.resolve(), dest / entry.name
        if entry.suffix == ".safetensors" and needs_cast(read_header(path)[0], target):
            report.largest_tensor_bytes = max(report.largest_tensor_bytes, cast_file(path, out, target))
            report.written.append(entry.name)
            report.bytes_written += out.stat().st_size
        elif entry.name == "config.json":
            config = json.loads(path.read_text())
            config["dtype"] = torch_dtype
            config.pop("torch_dtype", None)
            out.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            report.written.append(entry.name)
            report.bytes_written += out.stat().st_size
        else:
            out.unlink(missing_ok=True)
            clone_or_copy(path, out)
            report.cloned.append(entry.name)
            report.bytes_cloned += path.stat().st_size
    index = dest / "model.safetensors.index.json"
    if index.is_file() and report.written:
        # The index's total_size counts bytes of tensor data, which a cast changes.
        data = json.loads(index.read_text())
        total = 0
        for shard in {dest / name for name in data.get("weight_map", {}).values()}:
            _, start = read_header(shard)
            total += shard.stat().st_size - start
        data.setdefault("metadata", {})["total_size"] = total
        index.unlink()  # a clone of the source's index: replaced, not rewritten in place
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return report
