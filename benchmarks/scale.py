#!/usr/bin/env python3
"""The pipeline's IO stages at real model sizes, against the machine's own limits. A benchmark, not a test.

    .venv/bin/python benchmarks/scale.py [--shapes 1b,3b] [--keep DIR]

For each shape it generates a Llama-shaped checkpoint with random bf16 weights in sharded safetensors
(1b: Llama-3.2-1B's shape, 2.5 GB; 3b: Llama-3.2-3B's, 6.4 GB; 8b: Llama-3.1-8B's, 16 GB, where disk
allows), serves it from the loopback hub, and runs, each stage in its own child process so that peak RSS
and /proc/self/io belong to that stage alone:

  raw cp          cp -r of the checkpoint (the physical copy limit)
  raw sha256sum   sha256sum of its files (the physical hash limit)
  fetch           enginefoundry.inputs.sources.fetch through the hub (download into the HF cache + digests)
  convert (none)  bf16 → bf16: the reference lane's cast, which clones (a reflink on btrfs/XFS, an in-kernel
                  copy on ext4: never a hard link to the user's files, issue 21)
  convert (cast)  bf16 → fp32: streamed cast, one tensor in memory
  raw boto3       boto3 upload_file of the converted files to SeaweedFS (the physical upload limit)
  publish         the converted checkpoint to SeaweedFS through the store (content-addressed blobs)
  publish file    the converted checkpoint, then a bundle holding the same files (as the reference lane makes
                  it), to a file:// store on the same disk: blobs are copies the store owns (read-only), and the
                  bundle's files are blobs already, so the store writes each unique byte once
  verify          what `enginefoundry verify` does: every blob streamed back from S3 and re-hashed

and prints wall time, bytes read and written (rchar/wchar), peak RSS and the ratio to the stage's raw limit,
with the goals beside them: IO stages within 1.3× of their raw limit, bytes written ≤ 1.1× the unique bytes,
RSS flat in model size, a conversion that needs no cast writes (almost) nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "tests" / "fixtures" / "tiny-chat" / "model"
SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings (the public configs)
    "1b": (2048, 16, 32, 8, 8192, 128256, True),
    "3b": (3072, 28, 24, 8, 8192, 128256, True),
    "8b": (4096, 32, 32, 8, 14336, 128256, False),
}
SHARD_BYTES = 2 * 2**30

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
stage, args = sys.argv[1], json.loads(sys.argv[2])
t0 = time.monotonic()
out = {}
if stage == "fetch":
    from enginefoundry.inputs.sources import fetch
    from enginefoundry.spec.source import parse_source_uri
    snap = fetch(parse_source_uri(args["uri"]), progress=lambda m: None)
    out["local_dir"] = snap.local_dir
elif stage == "convert":
    from enginefoundry.inputs.checkpoint_cast import cast_checkpoint
    r = cast_checkpoint(Path(args["src"]), Path(args["dest"]), args["dtype"])
    out["bytes_cloned"], out["bytes_cast"] = r.bytes_cloned, r.bytes_written
elif stage == "publish":
    from enginefoundry.inputs.units import key_of
    from enginefoundry.store.publish import publish_checkpoint
    from enginefoundry.store.backends import open_store
    store = open_store(args["store"])
    components = {"benchmark": "scale", "shape": args["shape"]}
    key = key_of(components)
    m = publish_checkpoint(store, {"key": key, "key_components": components, "model": "scale", "variant": "fp32",
                                   "lane": "reference", "params": {}}, Path(args["src"]), progress=lambda m: None)
    out["ref"] = f"{store.uri}/manifests/scale/{key}"
    out["files"] = len(m.files)
elif stage == "publish_file":
    from enginefoundry.inputs.units import key_of
    from enginefoundry.store.publish import publish_build, publish_checkpoint
    from enginefoundry.store.backends import link_or_copy, open_store
    import shutil
    store = open_store(args["store"])
    components = {"benchmark": "scale", "shape": args["shape"]}
    key = key_of(components)
    publish_checkpoint(store, {"key": key, "key_components": components, "model": "scale", "variant": "bf16",
                               "lane": "reference", "params": {}}, Path(args["src"]), progress=lambda m: None)
    bundle = Path(args["bundle"])
    shutil.copytree(args["src"], bundle / "model", copy_function=link_or_copy)  # work files, as the lane links them
    ucomps = {"benchmark": "scale-unit", "shape": args["shape"]}
    r = publish_build(store, "scale", dict(key=key_of(ucomps), key_components=ucomps, model="scale", unit="u",
                      lane="reference", target={}, variant={}, profile={}, source={}, status="candidate"),
                      {"bundle": bundle}, progress=lambda m: None)
    out["bundle_bytes_uploaded"] = r.bytes_uploaded
elif stage == "verify":
    from enginefoundry.store.verify import open_build, verify_build
    store, build = open_build(args["ref"])
    report = verify_build(store, build)
    out["rc"], out["tail"] = (0 if report.ok else 1), str([p.model_dump() for p in report.problems][:3])
elif stage == "boto3":
    from enginefoundry.store.s3 import s3_client
    client = s3_client()
    for f in sorted(Path(args["src"]).iterdir()):
        client.upload_file(str(f), "enginefoundry", f"raw-{args['shape']}/{f.name}")
elif stage in ("cp", "sha256sum"):
    import subprocess
    cmd = ["cp", "-r", args["src"], args["dest"]] if stage == "cp" else ["sha256sum", *args["files"]]
    subprocess.run(cmd, check=True, capture_output=True)
wall = time.monotonic() - t0
io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall_s": wall, "rchar": int(io["rchar"]), "wchar": int(io["wchar"]),
                  "peak_rss_mib": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, kids) / 1024, **out}))
"""


def write_shards(folder: Path, shape: str) -> int:
    """Random bf16 weights with Llama's tensor names and shapes, in ≤ 2 GiB shards, plus index and config."""
    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    head_dim = hidden // heads
    tensors: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors += [(f"{p}.input_layernorm.weight", [hidden]), (f"{p}.post_attention_layernorm.weight", [hidden]),
                    (f"{p}.self_attn.q_proj.weight", [heads * head_dim, hidden]),
                    (f"{p}.self_attn.k_proj.weight", [kv * head_dim, hidden]),
                    (f"{p}.self_attn.v_proj.weight", [kv * head_dim, hidden]),
                    (f"{p}.self_attn.o_proj.weight", [hidden, heads * head_dim]),
                    (f"{p}.mlp.gate_proj.weight", [inter, hidden]), (f"{p}.mlp.up_proj.weight", [inter, hidden]),
                    (f"{p}.mlp.down_proj.weight", [hidden, inter])]
    tensors.append(("model.norm.weight", [hidden]))
    if not tied:
        tensors.append(("lm_head.weight", [vocab, hidden]))
    shards: list[list[tuple[str, list[int]]]] = [[]]
    size = 0
    for name, dims in tensors:
        n = 2 * dims[0] * (dims[1] if len(dims) > 1 else 1)
        if size + n > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += n
    block = os.urandom(64 << 20)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dims in shard:
            n = 2 * dims[0] * (dims[1] if len(dims) > 1 else 1)
            header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (folder / fname).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            left = offset
            while left > 0:
                chunk = block[: min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
        total += offset
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = json.loads((TINY / "config.json").read_text())
    config.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied, head_dim=head_dim,
                  dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copyfile(TINY / name, folder / name)
    return sum(p.stat().st_size for p in folder.iterdir())


def du(*paths: Path) -> int:
    """Bytes on disk under the paths, each hard-linked inode counted once (as `du` does)."""
    seen, total = set(), 0
    for root in paths:
        for d, _, files in os.walk(root):
            for name in files:
                st = os.lstat(os.path.join(d, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


class StageFailed(Exception):
    pass


def stage(name: str, args: dict, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(args)], env=env, capture_output=True,
                         text=True, cwd=REPO)
    if out.returncode != 0:
        raise StageFailed(f"stage {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # runs the finally blocks: the stack goes down, the temp folder goes


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1b,3b", help="comma-separated: 1b, 3b, 8b")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--no-cast", action="store_true",
                    help="skip the bf16→fp32 cast and publish the bf16 conversion (a 3b shape then fits in ~6× "
                         "its size of free disk instead of ~9×)")
    args = ap.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="ef-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EF_CACHE_DIR": str(tmp / "cache"), "HF_HOME": str(tmp / "hf"),
           "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": str(REPO),
           # The loopback hub serves git objects: store them uncompressed, random bytes don't compress.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.compression", "GIT_CONFIG_VALUE_0": "0"}
    state = tmp / "stack"
    port = {"EF_S3_PORT": env.get("EF_S3_PORT", "18533"), "EF_HUB_PORT": env.get("EF_HUB_PORT", "18534")}
    subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "up", "--state-dir", str(state),
                    "--services", "s3,hub"], env={**env, **port}, check=True, capture_output=True)
    env.update(json.loads((state / "env.json").read_text()))
    rows: list[dict] = []
    try:
        for shape in shapes:
            src = tmp / f"src-{shape}"
            src.mkdir(exist_ok=True)
            print(f"[{shape}] generating random bf16 weights …", flush=True)
            size = write_shards(src, shape)
            free = shutil.disk_usage(tmp).free
            # source, hub worktree + objects, hub cache, the bf16 clone, fp32 cast (2×) and its raw copy (2×), the
            # file:// store (1×, 2× with the cast); S3 holds the upload
            need = (8 if args.no_cast else 11) * size
            if free < need:
                print(f"[{shape}] skipped: {size / 2**30:.1f} GiB model needs ~{need / 2**30:.0f} GiB free, "
                      f"{free / 2**30:.0f} GiB free")
                shutil.rmtree(src)
                continue
            print(f"[{shape}] {size / 2**30:.2f} GiB; seeding the loopback hub …", flush=True)
            sys.path.insert(0, str(REPO))
            from tests.services.hub_server import seed_repo

            seed_repo(env["EF_HUB_ROOT"], f"bench/llama-{shape}", src)
            files = sorted(str(p) for p in src.iterdir())
            r_cp = stage("cp", {"src": str(src), "dest": str(tmp / f"cp-{shape}")}, env)
            r_sha = stage("sha256sum", {"files": files}, env)
            shutil.rmtree(tmp / f"cp-{shape}")
            before = du(tmp / "cache", tmp / "hf", tmp / f"work-{shape}")
            r_fetch = stage("fetch", {"uri": f"hf://bench/llama-{shape}@main"}, env)
            local = r_fetch["local_dir"]
            r_none = stage("convert", {"src": local, "dest": str(tmp / f"work-{shape}" / "bf16"),
                                       "dtype": "bfloat16"}, env)
            if args.no_cast:
                r_cast = None
                cast_dir = tmp / f"work-{shape}" / "bf16"  # what gets published: the linked bf16 conversion
                r_cp_cast = r_cp
            else:
                r_cast = stage("convert", {"src": local, "dest": str(tmp / f"work-{shape}" / "fp32"),
                                           "dtype": "float32"}, env)
                cast_dir = tmp / f"work-{shape}" / "fp32"
                r_cp_cast = stage("cp", {"src": str(cast_dir), "dest": str(tmp / f"cp2-{shape}")}, env)
                shutil.rmtree(tmp / f"cp2-{shape}")
            r_boto = stage("boto3", {"src": str(cast_dir), "shape": shape}, env)
            r_pub = stage("publish", {"src": str(cast_dir), "store": f"s3://enginefoundry/scale-{shape}",
                                      "shape": shape}, env)
            r_verify = stage("verify", {"ref": r_pub["ref"]}, env)
            file_store = tmp / f"store-{shape}"
            r_pub_file = stage("publish_file", {"src": str(cast_dir), "store": file_store.as_uri(), "shape": shape,
                                                "bundle": str(tmp / f"bundle-{shape}")}, env)
            in_store = du(file_store / "blobs")
            if r_verify["rc"] != 0:
                raise SystemExit(f"verify failed: {r_verify['tail']}")
            written = du(tmp / "cache", tmp / "hf", tmp / f"work-{shape}") - before
            # the source, and the fp32 cast (the bf16 "cast" is links to the source's files)
            unique = size + (0 if args.no_cast else du(cast_dir))
            published = "bf16" if args.no_cast else "fp32"
            raw_io = r_cp["wall_s"] + r_sha["wall_s"]
            cast_bytes = du(cast_dir)
            rows += [
                {"shape": shape, "stage": "raw cp", **r_cp, "limit_s": r_cp["wall_s"]},
                {"shape": shape, "stage": "raw sha256sum", **r_sha, "limit_s": r_sha["wall_s"]},
                {"shape": shape, "stage": "fetch (download+hash)", **r_fetch, "limit_s": raw_io},
                {"shape": shape, "stage": "convert bf16→bf16", **r_none, "limit_s": None},
                *([] if r_cast is None else [
                    {"shape": shape, "stage": "convert bf16→fp32", **r_cast, "limit_s": r_cp_cast["wall_s"]}]),
                {"shape": shape, "stage": "raw boto3 upload", **r_boto, "limit_s": r_boto["wall_s"]},
                # publish must hash (for the blob names) and upload: its limit is a plain upload plus a hash.
                {"shape": shape, "stage": f"publish {published} → S3", **r_pub,
                 "limit_s": r_boto["wall_s"] + r_sha["wall_s"] * cast_bytes / size},
                # verify streams every blob back from S3 and hashes it: the limit is hashing those bytes.
                {"shape": shape, "stage": "verify (S3 re-hash)", **r_verify,
                 "limit_s": r_sha["wall_s"] * cast_bytes / size},
                # hash, then an in-kernel copy into the store (plus the bundle: its files are blobs already).
                {"shape": shape, "stage": f"publish {published} → file://", **r_pub_file,
                 "limit_s": (r_cp_cast["wall_s"] + r_sha["wall_s"]) * cast_bytes / size},
            ]
            print(f"[{shape}] bytes written by fetch+convert: {written / 2**30:.2f} GiB for "
                  f"{unique / 2**30:.2f} GiB unique ({written / unique:.2f}×: the work checkpoint clones the "
                  f"source, {r_none['bytes_cloned'] / 2**30:.2f} GiB, a reflink where the filesystem has them); "
                  f"bf16→bf16 conversion cast {r_none['bytes_cast'] / 2**20:.1f} MiB", flush=True)
            print(f"[{shape}] bytes in the file:// store after the checkpoint and its bundle: {in_store / 2**30:.2f} "
                  f"GiB for {cast_bytes / 2**30:.2f} GiB unique ({in_store / cast_bytes:.3f}×, goal ≤ 1.1×); the "
                  f"bundle wrote {r_pub_file['bundle_bytes_uploaded'] / 2**20:.1f} MiB", flush=True)
            # Each shape's folders go before the next one: the larger shapes need the disk.
            for leftover in (src, tmp / f"work-{shape}", tmp / "hf", tmp / "cache", file_store, tmp / f"bundle-{shape}",
                             Path(env["EF_HUB_ROOT"]) / "bench" / f"llama-{shape}"):
                shutil.rmtree(leftover, ignore_errors=True)
    except StageFailed as err:
        print(err)
    finally:
        subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "down", "--state-dir", str(state)],
                       capture_output=True)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'shape':<6}{'stage':<24}{'wall s':>8}{'limit s':>9}{'ratio':>7}{'read GiB':>10}{'written GiB':>12}"
          f"{'peak RSS MiB':>14}")
    for r in rows:
        ratio = f"{r['wall_s'] / r['limit_s']:.2f}" if r.get("limit_s") else "-"
        limit = f"{r['limit_s']:.1f}" if r.get("limit_s") else "-"
        print(f"{r['shape']:<6}{r['stage']:<24}{r['wall_s']:>8.1f}{limit:>9}{ratio:>7}{r['rchar'] / 2**30:>10.2f}"
              f"{r['wchar'] / 2**30:>12.2f}{r['peak_rss_mib']:>14.0f}")
    print("\ngoals: IO stages ≤ 1.3× their raw limit; RSS flat in model size; the file:// store holds ≤ 1.1× the "
          "unique bytes; bf16→bf16 casts nothing (its clone is a reflink where the filesystem has them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
