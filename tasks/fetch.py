"""Stage: fetch the checkpoint and record its identity."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.inputs import adapters
from enginefoundry.inputs.quantized_source import refuse_contradiction
from enginefoundry.inputs.sources import SourceSnapshot, fetch
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.speculation import fetch_speculative_draft
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger
from enginefoundry.tasks._retry import NETWORK_RETRIES


# No task retries: a bad URI or revision is an input error, and huggingface_hub/botocore retry transient faults.
@task(name="fetch checkpoint", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def fetch_source(spec: BuildSpec) -> SourceSnapshot:
    log = progress_logger()
    # A pre-quantized source whose quantization a variant contradicts is refused before its weights are fetched.
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=log,
                     check=lambda quant: refuse_contradiction(spec, quant))
    log(f"fetch: {snapshot.uri} → {len(snapshot.files)} files, weights {snapshot.weights_digest[:12]}, "
        f"tokenizer {snapshot.tokenizer_digest[:12]}" + (f", commit {snapshot.revision}" if snapshot.revision else ""))
    return snapshot


@task(name="fetch draft", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def fetch_draft(spec: BuildSpec, target: SourceSnapshot) -> SourceSnapshot | None:
    """The `speculative.draft` checkpoint, fetched, pinned and digested like the base (None without one), and checked
    against the fetched target before any GPU time: the same vocabulary, and for draft_target the same tokenizer."""
    return fetch_speculative_draft(spec, target, progress_logger())


@task(name="fetch adapters", cache_policy=NO_CACHE, **NETWORK_RETRIES)
def fetch_adapters(spec: BuildSpec, base: SourceSnapshot) -> dict[str, SourceSnapshot]:
    """`model.adapters`, each checked against the fetched base from its adapter_config.json alone, then fetched,
    pinned and digested like the base (name → snapshot; empty without adapters)."""
    lane = get_lane(spec.lane)
    return adapters.fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress_logger())


@task(name="merge adapter", task_run_name="merge {name}", cache_policy=NO_CACHE)
def merge_adapter(base: SourceSnapshot, name: str, adapter: SourceSnapshot) -> SourceSnapshot:
    """The base ⊕ the adapter (PEFT merge_and_unload, float32): the source of that adapter's units."""
    return adapters.merged_source(base, name, adapter, progress_logger())
