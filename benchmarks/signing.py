#!/usr/bin/env python3
"""The cost of signing and of checking signatures on a large build. A benchmark, not a test.

    .venv/bin/python benchmarks/signing.py [--size-gib 6] [--files 3] [--workdir /tmp]

Writes a synthetic build of the given size (sparse files, each with a distinct random head so that no two are
one blob), publishes it to a file:// store under --workdir, then measures, each with the bytes it read from the
store counted:
  * publish (every blob hashed once while stored: the baseline),
  * signing the three attestations (provenance, gate, benchmark) over the manifest digest,
  * checking the signatures (`enginefoundry verify --signatures-only`),
  * a full verify (every blob re-hashed) for comparison.
Everything it wrote is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from enginefoundry.evidence.attest import sign_published, verify_attestations  # noqa: E402
from enginefoundry.evidence.signing import TrustedKey, TrustPolicy, keygen, signer_from_env  # noqa: E402
from enginefoundry.store.backends import FileStore  # noqa: E402
from enginefoundry.store.publish import publish_build, read_build  # noqa: E402
from enginefoundry.store.verify import verify_build  # noqa: E402


class CountingStore(FileStore):
    """A file:// store that counts the bytes read through it."""

    bytes_read = 0

    def read_bytes(self, key: str) -> bytes:
        data = super().read_bytes(key)
        CountingStore.bytes_read += len(data)
        return data

    def iter_bytes(self, key: str):
        for chunk in super().iter_bytes(key):
            CountingStore.bytes_read += len(chunk)
            yield chunk


def _timed(fn):
    CountingStore.bytes_read = 0
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, CountingStore.bytes_read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=6.0)
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ef-signing-bench-", dir=args.workdir))
    try:
        bundle = work / "bundle"
        bundle.mkdir()
        each = int(args.size_gib * 2**30) // args.files
        for i in range(args.files):
            with (bundle / f"rank{i}.engine").open("wb") as f:
                f.write(os.urandom(4096))
                f.truncate(each)
        store = CountingStore(f"file://{work / 'store'}")
        key_path, pub_path = keygen(work / "bench")
        signer = signer_from_env({"ENGINEFOUNDRY_SIGNING_KEY_FILE": str(key_path)})
        comps = {"bench": "signing", "size": each * args.files}
        from enginefoundry.inputs.units import key_of

        fields = dict(key=key_of(comps), key_components=comps, model="bench", unit="u", lane="reference",
                      target={}, variant={}, profile={}, source={}, status="candidate",
                      smoke={"smoke_agreement": 0.99}, benchmark={"points": [{"concurrency": 32}]})
        result, t_pub, r_pub = _timed(lambda: publish_build(store, "bench", fields, {"bundle": bundle},
                                                            progress=lambda _: None))
        _, t_sign, r_sign = _timed(lambda: sign_published(store, "bench", result.manifest.key, result.build_id,
                                                          signer, progress=lambda _: None))
        build = read_build(store, "bench", result.manifest.key, result.build_id)
        policy = TrustPolicy(keys=[TrustedKey(name="bench", public_key=pub_path.read_text())], require_signature=True)
        verdict, t_check, r_check = _timed(lambda: verify_attestations(store, build, policy))
        assert verdict.state == "verified", verdict.problems
        report, t_full, r_full = _timed(lambda: verify_build(store, build, record=False))
        assert report.ok
        rows = {"build_bytes": result.bytes_total, "files": len(result.manifest.files),
                "publish_s": round(t_pub, 3), "publish_read_from_store_bytes": r_pub,
                "sign_s": round(t_sign, 4), "sign_read_from_store_bytes": r_sign,
                "check_signatures_s": round(t_check, 4), "check_read_from_store_bytes": r_check,
                "full_verify_s": round(t_full, 3), "full_verify_read_from_store_bytes": r_full,
                "sign_overhead_vs_publish": f"{t_sign / t_pub:.2%}"}
        print(json.dumps(rows, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
