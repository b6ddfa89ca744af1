"""Stage: convert the checkpoint once per variant. The converted checkpoint is published under its own
key and reused by every target (and every later run) that needs it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from enginefoundry.build.sources import SourceSnapshot
from enginefoundry.build.units import KeyComponents, checkpoint_key_components, toolchain_identity
from enginefoundry.errors import StoreError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.lanes import ConvertResult, get_lane
from enginefoundry.locks import host_lock
from enginefoundry.settings import work_root
from enginefoundry.spec import BuildSpec, Variant
from enginefoundry.store.backends import Store, open_store
from enginefoundry.store.layout import manifests_prefix
from enginefoundry.store.manifest import BuildInput, InputFile, InputKind
from enginefoundry.store.publish import (
    PublishedBuild,
    check_hit,
    find_checkpoint_build,
    publish_checkpoint_build,
    quarantine_problems,
)
from enginefoundry.store.verify import pull
from enginefoundry.tasks._log import progress_logger

CHECKPOINT: InputKind = "converted-checkpoint"


class ConvertedCheckpoint(BaseModel):
    variant: str
    key: str
    result: ConvertResult
    reused: bool
    uri: str  # where the converted checkpoint is published
    input: BuildInput | None = None  # the published build the unit uses, by digest (None: the source itself)


class LocalCheckpoint(BaseModel):
    """The work folder's converted checkpoint and the manifest digest of the published build it holds (pulled, or
    converted here and published as that build): a later run reuses the folder only for that build."""

    result: ConvertResult
    manifest_sha256: str | None = None  # None: the source itself (a pass-through)

    @classmethod
    def read(cls, path: Path) -> LocalCheckpoint | None:
        try:
            return cls.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None


@task(name="convert checkpoint", task_run_name="convert {variant.name}", cache_policy=NO_CACHE)
def convert_variant(spec: BuildSpec, variant: Variant, snapshot: SourceSnapshot) -> ConvertedCheckpoint:
    lane = get_lane(spec.lane)
    components = KeyComponents.of(checkpoint_key_components(spec, variant, snapshot.weights_digest,
                                                            snapshot.tokenizer_digest,
                                                            toolchain_identity(spec, lane.versions()),
                                                            snapshot.quantization))
    ckey = components.key
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    uri = store.url(manifests_prefix(spec.model.name, ckey))
    workdir = work_root() / "checkpoints" / ckey[:16]
    # Workers that share a host (one per GPU) share this folder: one converts or downloads, the others wait
    # and then reuse its result instead of deleting the folder under it.
    with host_lock(workdir.with_name(workdir.name + ".lock")):
        return _convert_locked(spec, variant, snapshot, components, ckey, store, uri, workdir)


def _binding(build: PublishedBuild, origin: Literal["computed", "store"], proven_by: str = "") -> BuildInput:
    return BuildInput(kind=CHECKPOINT, key=build.key, uri=build.uri, sha256=build.manifest_sha256, origin=origin,
                      proven_by=proven_by, files=[InputFile(path=f.path, sha256=f.sha256) for f in build.files])


def _convert_locked(spec: BuildSpec, variant: Variant, snapshot: SourceSnapshot, components: KeyComponents,
                    ckey: str, store: Store, uri: str, workdir: Path) -> ConvertedCheckpoint:
    """Reuse the published checkpoint of `ckey` (pulled, each file checked against its manifest) or convert it here
    and publish it. A run that signs its build reuses only a build whose manifest digest a trusted key signed
    (evidence/inputs.py): any other is refused and converted again from the source, and the new build is signed."""
    log = progress_logger()
    lane = get_lane(spec.lane)
    trust = InputTrust.of_run(spec, progress=log)
    done = workdir / "convert-done.json"
    refused: str | None = None  # a current build this run refused: never adopted back when it publishes its own
    proven_by = ""
    try:
        published = find_checkpoint_build(store, spec.model.name, ckey)
        problems = check_hit(store, published) if published is not None else []
    except StoreError as err:
        published, problems = None, []
        log(f"convert: {variant.name}: published checkpoint {ckey[:12]} refused ({err}); converting again")
    if problems:
        moved = quarantine_problems(store, published, problems) if published is not None else []
        log(f"convert: {variant.name}: published checkpoint {ckey[:12]} refused: "
            + "; ".join(p.line() for p in problems[:3]) + "".join(f"; quarantined {m}" for m in moved)
            + "; converting again")
        refused = published.build_id if published is not None else None
        published = None
    if published is not None and trust.required:
        proven_by = trust.proven(store, CHECKPOINT, ckey).get(published.manifest_sha256, "")
        if not proven_by:
            trust.refuse(f"convert: {variant.name}: published checkpoint {ckey[:12]} (build {published.build_id})",
                         "its manifest is not signed by a trusted key, and this run signs its build; converting "
                         "again from the source")
            refused, published = published.build_id, None

    local = LocalCheckpoint.read(done)
    if published is not None and (checkpoint := published.checkpoint) is not None and (
            local is None or local.manifest_sha256 != published.manifest_sha256):
        log(f"convert: {variant.name}: fetching published checkpoint {ckey[:12]} (verified, copied by the kernel "
            "where the store is on this filesystem)")
        shutil.rmtree(workdir, ignore_errors=True)
        try:
            # Entries are checkpoint/<file>: they land in workdir/checkpoint.
            pull(store, published, workdir, clone=True)
        except StoreError as err:  # a blob with other bytes than its name: move it aside, convert again
            moved = quarantine_problems(store, published, check_hit(store, published, rehash=True))
            log(f"convert: {variant.name}: published checkpoint {ckey[:12]} refused ({err})"
                + "".join(f"; quarantined {m}" for m in moved) + "; converting again")
            refused, published = published.build_id, None
        else:
            local = LocalCheckpoint(result=ConvertResult(checkpoint_dir=str(workdir / "checkpoint"),
                                                         params=checkpoint.params.model_dump(mode="json")),
                                    manifest_sha256=published.manifest_sha256)
            done.write_text(local.model_dump_json(indent=2))
    if published is not None and published.checkpoint is not None and local is not None:
        if published.layout == "legacy":
            uri = published.uri.rsplit("/", 1)[0]
        log(f"convert: {variant.name}: reusing published checkpoint {ckey[:12]}"
            + (f" (signed by {proven_by})" if proven_by else ""))
        return ConvertedCheckpoint(variant=variant.name, key=ckey, reused=True, uri=uri, result=local.result,
                                   input=trust.record(_binding(published, "store", proven_by)))

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log(f"convert: {variant.name} with lane {lane.name}")
    result = lane.convert(spec, variant, Path(snapshot.local_dir), workdir)
    if Path(result.checkpoint_dir).resolve() == Path(snapshot.local_dir).resolve():
        # A pass-through (plain precision on the trtllm lane): the source itself is the checkpoint.
        done.write_text(LocalCheckpoint(result=result).model_dump_json(indent=2))
        return ConvertedCheckpoint(variant=variant.name, key=ckey, result=result, reused=False, uri=snapshot.uri)

    def sign(build: PublishedBuild) -> None:  # before the pointer names it: a signing run never leaves it unsigned
        trust.attest(store, CHECKPOINT, ckey, build.manifest_sha256, build.uri)

    mine, _ = publish_checkpoint_build(store, {"key": ckey, "key_components": components.as_json(),
                                               "model": spec.model.name, "variant": variant.name, "lane": spec.lane,
                                               "params": result.params},
                                       Path(result.checkpoint_dir), progress=log, replaces=refused,
                                       before_current=sign)
    # Written last: a half conversion is never reused. The folder holds this run's build, whichever is current.
    done.write_text(LocalCheckpoint(result=result, manifest_sha256=mine.manifest_sha256).model_dump_json(indent=2))
    return ConvertedCheckpoint(variant=variant.name, key=ckey, result=result, reused=False, uri=uri,
                               input=trust.record(_binding(mine, "computed")))
