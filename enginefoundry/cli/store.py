"""Commands over published builds in a store: verify, pull."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from enginefoundry.catalog.schemes import is_store_uri
from enginefoundry.cli.common import DEFAULT_MLFLOW, emit_json, load
from enginefoundry.cli.signing import check_signatures, policy_of, trust_options
from enginefoundry.console import console, error
from enginefoundry.errors import EXIT_OK, EXIT_PIPELINE, InputError
from enginefoundry.store.layout import BUILD_URI_SHAPE, LEGACY_URI_SHAPE, QUARANTINE_SHAPE

if TYPE_CHECKING:  # imported when a command runs: `enginefoundry --help` stays fast
    from enginefoundry.store.backends import Store
    from enginefoundry.store.publish import PublishedBuild
    from enginefoundry.store.verify import VerifyReport

REF_HELP = (f"a build: its store URI ({BUILD_URI_SHAPE}[/<build-id>.json], or a version 1 "
            f"{LEGACY_URI_SHAPE}), a unit key (with --store or --spec), or models:/name@alias")


def _common(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("ref", help=REF_HELP)
    cmd.add_argument("--store", help="store URI to look a key up in (s3://bucket/prefix or file://path)")
    cmd.add_argument("--spec", help="build spec whose store (and model) a key is looked up in")
    cmd.add_argument("--model", help="model name, to narrow a key lookup")
    cmd.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_MLFLOW),
                     help=f"MLflow tracking URI for models:/ references (default $MLFLOW_TRACKING_URI or "
                          f"{DEFAULT_MLFLOW})")
    cmd.add_argument("--workers", type=int, default=8, help="files checked or downloaded in parallel")
    trust_options(cmd)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ver = sub.add_parser("verify", help="re-hash every file of a published build; exit 1 naming each bad file")
    _common(ver)
    ver.add_argument("--repair", action="store_true",
                     help=f"move every corrupt blob aside ({QUARANTINE_SHAPE}), so that the next run refuses the "
                          "build as a cache hit and publishes fresh blobs")
    ver.add_argument("--signatures-only", action="store_true",
                     help="check the signed attestations only (a few KiB), not every file's sha256")
    ver.set_defaults(handler=cmd_verify)

    pul = sub.add_parser("pull", help="download a published build for serving: verified, parallel, resumable")
    _common(pul)
    pul.add_argument("dest", help="folder to download into (files already there and verified are kept)")
    pul.set_defaults(handler=cmd_pull)


def _resolve(args: argparse.Namespace) -> tuple[Store, PublishedBuild]:
    from enginefoundry.store.backends import open_store
    from enginefoundry.store.verify import find_by_key, open_build

    ref: str = args.ref
    if args.workers < 1:
        raise InputError("--workers must be at least 1")
    endpoint = None
    store_uri, model = args.store, args.model
    if args.spec:
        spec, _ = load(args.spec)
        store_uri = store_uri or spec.publish.store
        model = model or spec.model.name
        endpoint = spec.publish.s3_endpoint_url
    if ref.startswith("models:/"):
        from enginefoundry.records.lineage import registry_anchor, resolve

        _, uri, registry = resolve(ref, args.mlflow_uri)
        return open_build(uri, endpoint, anchor=registry_anchor(registry))
    if is_store_uri(ref):  # a scheme of the catalog (enginefoundry/catalog/schemes.py)
        return open_build(ref, endpoint)
    if store_uri is None:
        raise InputError(f"'{ref}' is not a store URI or models:/ reference; to look up a key give --store or --spec")
    store = open_store(store_uri, endpoint)
    return store, find_by_key(store, ref, model)


def cmd_verify(args: argparse.Namespace) -> int:
    from enginefoundry.evidence.attest import verify_attestations
    from enginefoundry.store.verify import VerifyReport, verify_build

    store, build = _resolve(args)
    verdict = verify_attestations(store, build, policy_of(args))
    if args.signatures_only:
        report = VerifyReport(uri=build.uri, build_id=build.build_id, ok=True, files=0, bytes=0, seconds=0.0,
                              problems=[], mode="cheap")
    else:
        report = verify_build(store, build, workers=args.workers, repair=args.repair)
    ok = report.ok and verdict.ok
    if args.json:
        emit_json({**report.model_dump(mode="json"), "ok": ok, "signature": verdict.model_dump(mode="json")})
    else:
        if args.signatures_only:
            pass
        elif report.ok:
            console.print(f"ok: {report.uri}: {report.files} files, {report.bytes / 2**20:.1f} MiB verified in "
                          f"{report.seconds:.1f} s ({report.mib_per_s:.0f} MiB/s)", markup=False, highlight=False)
            if report.record and report.record.startswith("not recorded"):
                console.print(f"  note: {report.record}", markup=False, highlight=False, soft_wrap=True)
        else:
            error(f"{report.uri}: {len(report.problems)} problem(s) in {report.files} files")
            for p in report.problems:
                console.print(f"  {p.line()}", markup=False, highlight=False, soft_wrap=True)
            console.print(_fix(report, args.ref), markup=False, highlight=False, soft_wrap=True)
        if verdict.ok:
            console.print(f"signature: {verdict.line()}", markup=False, highlight=False, soft_wrap=True)
        else:
            error(f"{build.uri}: signature check failed")
            for cause in verdict.problems:
                console.print(f"  {cause}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK if ok else EXIT_PIPELINE


def _fix(report: VerifyReport, ref: str) -> str:
    """What to do next, for what was found: only fixes that work."""
    lines = [f"  quarantined {q}" for q in report.quarantined]
    if report.quarantined:
        lines.append("fix: `enginefoundry run SPEC` now refuses this build as a cache hit and publishes fresh blobs "
                     "(every build that lists them is whole again)")
    elif any(p.corrupt for p in report.problems):
        lines.append(f"fix: `enginefoundry verify --repair {ref}` moves the corrupt blobs aside, then `enginefoundry "
                     "run SPEC` rebuilds the unit; or `enginefoundry run SPEC --force`, which re-hashes every blob "
                     "it reuses")
    elif report.problems:
        lines.append("fix: do not serve this build; `enginefoundry run SPEC --force` publishes a new one")
    return "\n".join(lines)


def cmd_pull(args: argparse.Namespace) -> int:
    from enginefoundry.store.verify import pull

    store, build = _resolve(args)
    verdict = check_signatures(args, store, build, "pull")  # before any byte is downloaded
    report = pull(store, build, Path(args.dest), workers=args.workers)
    if args.json:
        emit_json({**report.model_dump(mode="json"), "signature": verdict.model_dump(mode="json")})
    else:
        console.print(f"pulled {report.uri} → {report.dest}: {report.downloaded} downloaded "
                      f"({report.bytes_downloaded / 2**20:.1f} MiB), {report.kept} already present and verified, "
                      f"{report.seconds:.1f} s", markup=False, highlight=False)
        console.print(f"signature: {verdict.line()}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK
