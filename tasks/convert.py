"""Stage: convert the checkpoint once per variant; every target that needs it reuses it."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from enginefoundry.lanes import ConvertResult, get_lane
from enginefoundry.pipeline import work_root
from enginefoundry.plan import checkpoint_key_components, key_of, toolchain_identity
from enginefoundry.sources import SourceSnapshot
from enginefoundry.spec import BuildSpec, Variant
from tasks._log import progress_logger


class ConvertedCheckpoint(BaseModel):
    variant: str
    key: str
    result: ConvertResult
    reused: bool


@task(name="convert checkpoint", task_run_name="convert {variant.name}", cache_policy=NO_CACHE)
def convert_variant(spec: BuildSpec, variant: Variant, snapshot: SourceSnapshot) -> ConvertedCheckpoint:
    log = progress_logger()
    lane = get_lane(spec.lane)
    toolchain = toolchain_identity(spec, lane.versions())
    ckey = key_of(checkpoint_key_components(spec, variant, snapshot.weights_digest, snapshot.tokenizer_digest,
                                            toolchain))
    workdir = work_root() / "checkpoints" / ckey[:16]
    done = workdir / "convert-result.json"
    if done.is_file():
        log(f"convert: {variant.name}: reusing converted checkpoint {ckey[:12]}")
        return ConvertedCheckpoint(variant=variant.name, key=ckey,
                                   result=ConvertResult.model_validate_json(done.read_text()), reused=True)
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"convert: {variant.name} with lane {lane.name}")
    result = lane.convert(spec, variant, Path(snapshot.local_dir), workdir)
    done.write_text(result.model_dump_json(indent=2))  # written last: a half conversion is never reused
    return ConvertedCheckpoint(variant=variant.name, key=ckey, result=result, reused=False)
