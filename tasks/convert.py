"""Stage: convert the checkpoint once per variant. The converted checkpoint is published under its own
key and reused by every target (and every later run) that needs it."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from enginefoundry.build.sources import SourceSnapshot
from enginefoundry.build.units import KeyComponents, checkpoint_key_components, toolchain_identity
from enginefoundry.errors import StoreError
from enginefoundry.lanes import ConvertResult, get_lane
from enginefoundry.locks import host_lock
from enginefoundry.records.run_summary import work_root
from enginefoundry.spec import BuildSpec, Variant
from enginefoundry.store.backends import Store, open_store
from enginefoundry.store.publish import (
    check_hit,
    find_checkpoint_build,
    manifests_prefix,
    publish_checkpoint,
    quarantine_problems,
)
from enginefoundry.store.verify import pull
from enginefoundry.tasks._log import progress_logger


class ConvertedCheckpoint(BaseModel):
    variant: str
    key: str
    result: ConvertResult
    reused: bool
    uri: str  # where the converted checkpoint is published


@task(name="convert checkpoint", task_run_name="convert {variant.name}", cache_policy=NO_CACHE)
def convert_variant(spec: BuildSpec, variant: Variant, snapshot: SourceSnapshot) -> ConvertedCheckpoint:
    lane = get_lane(spec.lane)
    components = KeyComponents.of(checkpoint_key_components(spec, variant, snapshot.weights_digest,
                                                            snapshot.tokenizer_digest,
                                                            toolchain_identity(spec, lane.versions())))
    ckey = components.key
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    uri = store.url(manifests_prefix(spec.model.name, ckey))
    workdir = work_root() / "checkpoints" / ckey[:16]
    # Workers that share a host (one per GPU) share this folder: one converts or downloads, the others wait
    # and then reuse its result instead of deleting the folder under it.
    with host_lock(workdir.with_name(workdir.name + ".lock")):
        return _convert_locked(spec, variant, snapshot, components, ckey, store, uri, workdir)


def _convert_locked(spec: BuildSpec, variant: Variant, snapshot: SourceSnapshot, components: KeyComponents,
                    ckey: str, store: Store, uri: str, workdir: Path) -> ConvertedCheckpoint:
    log = progress_logger()
    lane = get_lane(spec.lane)
    done = workdir / "convert-result.json"
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
        published = None

    if published is not None and (checkpoint := published.checkpoint) is not None and not done.is_file():
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
            published = None
        else:
            result = ConvertResult(checkpoint_dir=str(workdir / "checkpoint"), params=checkpoint.params)
            done.write_text(result.model_dump_json(indent=2))
    if published is not None and published.checkpoint is not None:
        if published.layout == "legacy":
            uri = published.uri.rsplit("/", 1)[0]
        log(f"convert: {variant.name}: reusing published checkpoint {ckey[:12]}")
        return ConvertedCheckpoint(variant=variant.name, key=ckey, reused=True, uri=uri,
                                   result=ConvertResult.model_validate_json(done.read_text()))

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log(f"convert: {variant.name} with lane {lane.name}")
    result = lane.convert(spec, variant, Path(snapshot.local_dir), workdir)
    if Path(result.checkpoint_dir).resolve() == Path(snapshot.local_dir).resolve():
        # A pass-through (plain precision on the trtllm lane): the source itself is the checkpoint.
        done.write_text(result.model_dump_json(indent=2))
        return ConvertedCheckpoint(variant=variant.name, key=ckey, result=result, reused=False, uri=snapshot.uri)
    publish_checkpoint(store, {"key": ckey, "key_components": components.as_json(), "model": spec.model.name,
                               "variant": variant.name, "lane": spec.lane, "params": result.params},
                       Path(result.checkpoint_dir), progress=log)
    done.write_text(result.model_dump_json(indent=2))  # written last: a half conversion is never reused
    return ConvertedCheckpoint(variant=variant.name, key=ckey, result=result, reused=False, uri=uri)
