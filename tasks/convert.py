"""Stage: convert the checkpoint once per variant. The converted checkpoint is published under its own
key and reused by every target (and every later run) that needs it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from enginefoundry.errors import StoreError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.inputs.sources import SourceSnapshot
from enginefoundry.inputs.units import KeyComponents, checkpoint_key_components, toolchain_identity
from enginefoundry.lanes import ConvertResult, get_lane
from enginefoundry.locks import host_lock
from enginefoundry.planning.checkpoint_reuse import (
    PublishedCheckpoint,
    Refusal,
    ReuseAction,
    decide_checkpoint_reuse,
)
from enginefoundry.records.unit_run import ConvertedCheckpoint
from enginefoundry.settings import work_root
from enginefoundry.spec import BuildSpec, Variant
from enginefoundry.store.backends import Store, open_store
from enginefoundry.store.layout import manifests_prefix
from enginefoundry.store.manifest import BuildInput, InputFile, InputKind
from enginefoundry.store.publish import (
    Problem,
    PublishedBuild,
    check_hit,
    find_checkpoint_build,
    publish_checkpoint_build,
    quarantine_problems,
)
from enginefoundry.store.verify import pull
from enginefoundry.tasks._log import progress_logger

CHECKPOINT: InputKind = "converted-checkpoint"



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
        return _convert_locked(_Conversion(spec=spec, variant=variant, snapshot=snapshot, components=components,
                                           store=store, uri=uri, workdir=workdir, log=progress_logger()))


@dataclass(frozen=True)
class _Conversion:
    """One variant's conversion under its host lock: the checkpoint key's store address and work folder."""

    spec: BuildSpec
    variant: Variant
    snapshot: SourceSnapshot
    components: KeyComponents
    store: Store
    uri: str
    workdir: Path
    log: Callable[[str], None]

    @property
    def ckey(self) -> str:
        return self.components.key

    @property
    def done(self) -> Path:
        return self.workdir / "convert-done.json"


def _binding(build: PublishedBuild, origin: Literal["computed", "store"], proven_by: str = "") -> BuildInput:
    return BuildInput(kind=CHECKPOINT, key=build.key, uri=build.uri, sha256=build.manifest_sha256, origin=origin,
                      proven_by=proven_by, files=[InputFile(path=f.path, sha256=f.sha256) for f in build.files])


def _convert_locked(c: _Conversion) -> ConvertedCheckpoint:
    """Reuse the published checkpoint of the key (pulled, each file checked against its manifest) or convert it
    here and publish it (planning/checkpoint_reuse.py decides). A run that signs its build reuses only a build whose
    manifest digest a trusted key signed (evidence/inputs.py): any other is refused and converted again from the
    source, and the new build is signed."""
    trust = InputTrust.of_run(c.spec, progress=c.log)
    published, problems = _published(c)
    proven_by = ""
    if published is not None and not problems and trust.required:
        proven_by = trust.proven(c.store, CHECKPOINT, c.ckey).get(published.manifest_sha256, "")
    local = LocalCheckpoint.read(c.done)
    decision = decide_checkpoint_reuse(
        None if published is None else PublishedCheckpoint(build_id=published.build_id,
                                                           manifest_sha256=published.manifest_sha256,
                                                           has_checkpoint=published.checkpoint is not None),
        problems=bool(problems), signing=trust.required, signed=bool(proven_by),
        local_holds=local.manifest_sha256 if local is not None else None)
    refused = decision.refused_build  # a current build this run refused: never adopted back when it publishes its own
    if published is not None and decision.refusal is Refusal.PROBLEMS:
        moved = quarantine_problems(c.store, published, problems)
        c.log(f"convert: {c.variant.name}: published checkpoint {c.ckey[:12]} refused: "
              + "; ".join(p.line() for p in problems[:3]) + "".join(f"; quarantined {m}" for m in moved)
              + "; converting again")
    elif published is not None and decision.refusal is Refusal.UNSIGNED:
        trust.refuse(f"convert: {c.variant.name}: published checkpoint {c.ckey[:12]} (build {published.build_id})",
                     "its manifest is not signed by a trusted key, and this run signs its build; converting "
                     "again from the source")
    if published is not None and decision.action is ReuseAction.PULL:
        local = _pull(c, published)
        refused = None if local is not None else published.build_id
    if published is not None and local is not None and decision.action is not ReuseAction.CONVERT:
        uri = published.uri.rsplit("/", 1)[0] if published.layout == "legacy" else c.uri
        c.log(f"convert: {c.variant.name}: reusing published checkpoint {c.ckey[:12]}"
              + (f" (signed by {proven_by})" if proven_by else ""))
        return ConvertedCheckpoint(variant=c.variant.name, key=c.ckey, reused=True, uri=uri, result=local.result,
                                   input=trust.record(_binding(published, "store", proven_by)))
    return _convert(c, trust, refused)


def _published(c: _Conversion) -> tuple[PublishedBuild | None, list[Problem]]:
    """The published build of the checkpoint key and the problems its check found; none where the store refused."""
    try:
        published = find_checkpoint_build(c.store, c.spec.model.name, c.ckey)
        return published, check_hit(c.store, published) if published is not None else []
    except StoreError as err:
        c.log(f"convert: {c.variant.name}: published checkpoint {c.ckey[:12]} refused ({err}); converting again")
        return None, []


def _pull(c: _Conversion, published: PublishedBuild) -> LocalCheckpoint | None:
    """The published checkpoint pulled into the work folder and recorded there; None where a blob had other bytes
    than its name (moved aside: the variant is converted again)."""
    checkpoint = published.checkpoint
    assert checkpoint is not None  # decide_checkpoint_reuse pulls only a converted checkpoint's build
    c.log(f"convert: {c.variant.name}: fetching published checkpoint {c.ckey[:12]} (verified, copied by the kernel "
          "where the store is on this filesystem)")
    shutil.rmtree(c.workdir, ignore_errors=True)
    try:
        # Entries are checkpoint/<file>: they land in workdir/checkpoint.
        pull(c.store, published, c.workdir, clone=True)
    except StoreError as err:  # a blob with other bytes than its name: move it aside, convert again
        moved = quarantine_problems(c.store, published, check_hit(c.store, published, rehash=True))
        c.log(f"convert: {c.variant.name}: published checkpoint {c.ckey[:12]} refused ({err})"
              + "".join(f"; quarantined {m}" for m in moved) + "; converting again")
        return None
    local = LocalCheckpoint(result=ConvertResult(checkpoint_dir=str(c.workdir / "checkpoint"),
                                                 params=checkpoint.params.model_dump(mode="json")),
                            manifest_sha256=published.manifest_sha256)
    c.done.write_text(local.model_dump_json(indent=2))
    return local


def _convert(c: _Conversion, trust: InputTrust, refused: str | None) -> ConvertedCheckpoint:
    """Converted here from the source and published (signed first where the run signs); a pass-through is the
    source itself."""
    lane = get_lane(c.spec.lane)
    shutil.rmtree(c.workdir, ignore_errors=True)
    c.workdir.mkdir(parents=True)
    c.log(f"convert: {c.variant.name} with lane {lane.name}")
    result = lane.convert(c.spec, c.variant, Path(c.snapshot.local_dir), c.workdir)
    if Path(result.checkpoint_dir).resolve() == Path(c.snapshot.local_dir).resolve():
        # A pass-through (plain precision on the trtllm lane): the source itself is the checkpoint.
        c.done.write_text(LocalCheckpoint(result=result).model_dump_json(indent=2))
        return ConvertedCheckpoint(variant=c.variant.name, key=c.ckey, result=result, reused=False,
                                   uri=c.snapshot.uri)

    def sign(build: PublishedBuild) -> None:  # before the pointer names it: a signing run never leaves it unsigned
        trust.attest(c.store, CHECKPOINT, c.ckey, build.manifest_sha256, build.uri)

    mine, _ = publish_checkpoint_build(c.store, {"key": c.ckey, "key_components": c.components.as_json(),
                                                 "model": c.spec.model.name, "variant": c.variant.name,
                                                 "lane": c.spec.lane, "params": result.params},
                                       Path(result.checkpoint_dir), progress=c.log, replaces=refused,
                                       before_current=sign)
    # Written last: a half conversion is never reused. The folder holds this run's build, whichever is current.
    c.done.write_text(LocalCheckpoint(result=result, manifest_sha256=mine.manifest_sha256).model_dump_json(indent=2))
    return ConvertedCheckpoint(variant=c.variant.name, key=c.ckey, result=result, reused=False, uri=c.uri,
                               input=trust.record(_binding(mine, "computed")))
