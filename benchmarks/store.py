#!/usr/bin/env python3
"""The content-addressed store: storage amplification, verify throughput, memory, all-hits rerun. A benchmark,
not a test.

    .venv/bin/python benchmarks/store.py [--size-gib 1] [--store s3://bucket/prefix] [--keep]

It measures the store layer directly, as the reference lane's pipeline drives it, without models or servers
(a real pipeline run of a ≥ 1 GiB model costs minutes of CPU per variant on a small machine and adds nothing
to what is measured here):

  * a generated model of --size-gib (random safetensors shards + config/tokenizer files), in a temp dir;
  * two variants: fp32 (the shards as they are) and bf16 (half-size shards of other bytes), sharing the
    config and tokenizer files. For each: "convert" writes the checkpoint into the work folder, the checkpoint
    is published, the bundle is made from it with hard links (as lanes/reference.py does: both are work
    files), the bundle is published — so a bundle shares every weight blob with its checkpoint;
  * bytes written = what this process wrote (write(2) bytes, /proc/self/io wchar) into work and store, plus
    the bytes uploaded for an S3 store; unique bytes = the distinct file contents (by sha256) of both variants.
    The ≤ 1.1 goal is the store's own: bytes of blobs in the store / unique bytes. Work + store is ≈ 2 on
    either kind of store: blobs are the store's own copies (issue 21: never hard links of work files; a
    reflink on btrfs/XFS shares extents, not inodes, so there the disk holds ≈ 1×);
  * `verify` (enginefoundry.store.verify.verify_build, full re-hash) against `sha256sum` of the same blob files, in
    this run, page cache warm for both, best of two;
  * peak RSS (VmHWM) of a child process that verifies the fp32 unit and of one that verifies the same files
    with 16 MiB shards (same count, same parallelism: the difference is what file size costs);
  * wall time of the cold publish of both variants against the all-hits rerun (find_current + check_hit of
    every checkpoint and unit, as `run` does for a hit).

Every figure is printed beside its goal (issue 9).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from enginefoundry.identity import sha256_file  # noqa: E402
from enginefoundry.inputs.units import key_of  # noqa: E402
from enginefoundry.store.backends import blob_key, link_or_copy, open_store  # noqa: E402
from enginefoundry.store.publish import (  # noqa: E402
    check_hit,
    find_checkpoint_build,
    find_current,
    publish_build,
    publish_checkpoint,
)

SHARDS = 4
QUIET: dict[str, Any] = {"progress": lambda _: None}
CHILD = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from enginefoundry.store.backends import open_store
from enginefoundry.store.verify import open_build, verify_build
store, build = open_build(sys.argv[2])
t0 = time.monotonic()
report = verify_build(store, build, record=False)
print(json.dumps({"ok": report.ok, "bytes": report.bytes, "wall_s": time.monotonic() - t0,
                  # VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork + exec from the parent
                  "peak_rss_mib": next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines()
                                       if l.startswith("VmHWM:")) / 1024}))
"""


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar")


def write_safetensors(path: Path, size: int, seed: bytes) -> None:
    """A valid safetensors file of one U8 tensor with `size` bytes of pseudo-random data (fast: a keyed block
    repeated with a counter, so shards never share bytes)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(8 << 20)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        left, n = size, 0
        while left > 0:
            chunk = hashlib.sha256(seed + n.to_bytes(8, "little")).digest() + block
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
            n += 1


def small_files(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(5000)}}}))
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')


def convert(variant: str, total: int, work: Path) -> Path:
    """What a lane's convert writes: the variant's shards and the (shared, byte-identical) small files."""
    out = work / "checkpoints" / variant / "checkpoint"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    per = (total if variant == "fp32" else total // 2) // SHARDS
    for i in range(SHARDS):
        write_safetensors(out / f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors", per, f"{variant}{i}".encode())
    small_files(out)
    return out


def pipeline(store_uri: str, work: Path, total: int, convert_first: bool) -> tuple[dict[str, str], int]:
    """Both variants through convert → publish checkpoint → bundle (hard links) → publish unit. Returns the
    unit manifest URI per variant and the bytes the publishes sent (uploads to S3 are socket writes, which
    /proc/self/io's wchar does not count)."""
    store = open_store(store_uri)
    uris, sent = {}, 0
    for variant in ("fp32", "bf16"):
        ckpt = convert(variant, total, work) if convert_first else work / "checkpoints" / variant / "checkpoint"
        ccomps = {"kind": "checkpoint", "variant": variant}
        before = set(store.list("blobs/"))
        publish_checkpoint(store, {"key": key_of(ccomps), "key_components": ccomps, "model": "bench",
                                   "variant": variant, "lane": "reference", "params": {}}, ckpt, **QUIET)
        sent += sum(store.size(k) or 0 for k in set(store.list("blobs/")) - before)
        unit_dir = work / "units" / variant
        shutil.rmtree(unit_dir, ignore_errors=True)
        shutil.copytree(ckpt, unit_dir / "bundle" / "model", copy_function=link_or_copy)
        (unit_dir / "bundle" / "bundle.json").write_text(json.dumps({"lane": "reference", "variant": variant}))
        ucomps = {"kind": "unit", "variant": variant}
        result = publish_build(store, "bench", dict(
            key=key_of(ucomps), key_components=ucomps, model="bench", unit=f"{variant}.chat.cpu", lane="reference",
            target={}, variant={"name": variant}, profile={}, source={}, status="candidate"),
            {"bundle": unit_dir / "bundle"}, **QUIET)
        uris[variant] = result.uri
        sent += result.bytes_uploaded
    return uris, sent


def all_hits(store_uri: str) -> int:
    store = open_store(store_uri)
    problems = 0
    for variant in ("fp32", "bf16"):
        ck = find_checkpoint_build(store, "bench", key_of({"kind": "checkpoint", "variant": variant}))
        unit = find_current(store, "bench", key_of({"kind": "unit", "variant": variant}))
        assert ck is not None and unit is not None
        problems += len(check_hit(store, ck)) + len(check_hit(store, unit))
    return problems


def unique_bytes(work: Path) -> int:
    seen: dict[str, int] = {}
    for variant in ("fp32", "bf16"):
        for f in (work / "checkpoints" / variant / "checkpoint").iterdir():
            seen[sha256_file(f)] = f.stat().st_size
        bj = work / "units" / variant / "bundle" / "bundle.json"
        seen[sha256_file(bj)] = bj.stat().st_size
    return sum(seen.values())


def verify_child(uri: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), uri], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="fp32 weights size (bf16 is half); default 1")
    ap.add_argument("--store", help="store URI (default: a file:// store beside the work folder, one filesystem)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    total = int(args.size_gib * 2**30)
    tmp = Path(tempfile.mkdtemp(prefix="ef-bench-store-"))
    try:
        work = tmp / "work"
        store_uri = args.store or f"file://{tmp / 'store'}"
        store = open_store(store_uri)

        w0, t0 = wchar(), time.monotonic()
        uris, sent = pipeline(store_uri, work, total, convert_first=True)
        cold_s, written = time.monotonic() - t0, wchar() - w0
        if not store_uri.startswith("file://"):
            written += sent  # file:// copies are write(2) calls, already counted; hard links write nothing
        convert_bytes = sum(f.stat().st_size for v in ("fp32", "bf16")
                            for f in (work / "checkpoints" / v / "checkpoint").iterdir())
        uniq = unique_bytes(work)
        in_store = sum(store.size(k) or 0 for k in store.list("blobs/"))

        t0 = time.monotonic()
        problems = all_hits(store_uri)
        hits_s = time.monotonic() - t0
        assert problems == 0

        # verify vs sha256sum over the same blobs (page cache warm for both; best of two).
        build = find_current(store, "bench", key_of({"kind": "unit", "variant": "fp32"}))
        assert build is not None
        blob_paths = [str(tmp / "store" / blob_key(e.sha256)) for e in build.files] if not args.store else []
        best_verify, best_sum, best_ssl = float("inf"), float("inf"), float("inf")
        verified = {}
        for _ in range(2):
            verified = verify_child(uris["fp32"])
            best_verify = min(best_verify, verified["wall_s"])
            if blob_paths:
                t0 = time.monotonic()
                subprocess.run(["sha256sum", *blob_paths], check=True, capture_output=True)
                best_sum = min(best_sum, time.monotonic() - t0)
                if shutil.which("openssl"):
                    t0 = time.monotonic()
                    subprocess.run(["openssl", "dgst", "-sha256", *blob_paths], check=True, capture_output=True)
                    best_ssl = min(best_ssl, time.monotonic() - t0)
        vbytes = verified["bytes"]

        # Peak RSS: the same files (count, names, parallelism) with 16 MiB shards against the whole unit.
        small = tmp / "small"
        shutil.copytree(work / "units" / "fp32" / "bundle", small)
        for shard in small.glob("model/*.safetensors"):
            shard.unlink()
            write_safetensors(shard, 16 << 20, b"small" + shard.name.encode())
        small_uri = publish_build(store, "bench", dict(
            key=key_of({"kind": "small"}), key_components={"kind": "small"}, model="bench", unit="small",
            lane="reference", target={}, variant={}, profile={}, source={}, status="candidate"),
            {"bundle": small}, **QUIET).uri
        rss_small = verify_child(small_uri)["peak_rss_mib"]

        rows = [
            ("model (fp32 weights; bf16 is half)", f"{total / 2**30:.2f} GiB", "≥ 1 GiB"),
            ("bytes written (store + work)", f"{written / 2**20:.0f} MiB", ""),
            ("  of which convert wrote (work checkpoints)", f"{convert_bytes / 2**20:.0f} MiB", ""),
            ("unique bytes (distinct contents)", f"{uniq / 2**20:.0f} MiB", ""),
            ("written / unique (work + store)", f"{written / uniq:.3f}", "≈ 2: the store owns a copy"),
            ("bytes in the store (blobs)", f"{in_store / 2**20:.0f} MiB", ""),
            ("store / unique", f"{in_store / uniq:.3f}", "≤ 1.1"),
            ("verify throughput (full re-hash, fp32 unit)", f"{vbytes / 2**20 / best_verify:.0f} MiB/s", ""),
        ]
        if blob_paths:
            rows += [("sha256sum of the same files", f"{vbytes / 2**20 / best_sum:.0f} MiB/s", ""),
                     ("verify / sha256sum", f"{best_sum / best_verify:.2f}×", "≥ 0.9×")]
            if best_ssl < float("inf"):
                rows += [("openssl dgst -sha256 of the same files (context)", f"{vbytes / 2**20 / best_ssl:.0f} MiB/s",
                          "")]
        rows += [
            ("peak RSS, verify of the whole unit", f"{verified['peak_rss_mib']:.0f} MiB", "flat in file size"),
            ("peak RSS, verify of the same unit with 16 MiB shards", f"{rss_small:.0f} MiB", ""),
            ("cold: convert + publish both variants", f"{cold_s:.2f} s", ""),
            ("all-hits rerun (find + check every hit)", f"{hits_s:.3f} s", "≪ cold"),
            ("all-hits / cold", f"{hits_s / cold_s:.4f}", ""),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"\nstore {store_uri} · work {work} · {os.cpu_count()} CPUs")
        print(f"{'measure':<{width}}  {'value':>12}  goal")
        for name, value, goal in rows:
            print(f"{name:<{width}}  {value:>12}  {goal}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
