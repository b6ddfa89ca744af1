"""The rollout flow: detect a new checkpoint or toolchain → build (only when new) → promote or hold each candidate.

Scheduled (deployment.yaml: `rollout/scheduled`), it usually finds nothing new and finishes after one
revision lookup and a few registry queries, before any download. When the source (or a LoRA adapter of
`model.adapters`: that adapter's units alone miss, docs/adapters.md#rollout) or the toolchain (a new
TensorRT-LLM release or image digest in the spec or in the toolchain channel it follows, other lane versions on
this host) changed for some targets, it
builds those targets with the spec's toolchain (embedded or cluster mode, as the build flow does), and reports old
vs new per rebuilt target (Prefect artifact `rollout-comparison`, and the build's MLflow parent run: artifacts
rollout/comparison.json and .md). Then, built or not, each alias stem's
gated candidate that is newer than its champion is compared and promoted or held (promotion.decide_promotions),
with the thresholds below, which are flow parameters so the UI form shows them.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.client.schemas.objects import State

from enginefoundry.errors import InputError
from enginefoundry.flows.build_engines import (
    Mode,
    build_engines,
    flow_spec,
    flow_value,
    input_failure,
    readable_name,
    spec_label,
    spec_payload,
)
from enginefoundry.flows.reports import report_markdown, report_table
from enginefoundry.inputs.units import expand_units
from enginefoundry.records.promotion import PromotionPolicy, alias_stems
from enginefoundry.records.run_summary import UnitsNotPassed
from enginefoundry.rollout.source_change import RolloutReport
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks.cancel_watch import watching
from enginefoundry.tasks.promote import (
    compare_rebuilt,
    detect_source_change,
    end_orphaned_runs,
    follow_channel,
    measure_side_by_side,
    promote_units,
    record_trigger,
)


def _run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return readable_name(f"rollout {spec_label(params)}")


@flow(name="rollout", flow_run_name=_run_name, log_prints=True)
def rollout(
    spec_path: str | None = "configs/tiny-cpu.yaml",
    spec: dict[str, Any] | None = None,  # JSON edge: an inline spec, as the UI's form and API callers send it
    targets: list[str] | None = None,
    mode: Mode = "embedded",
    max_accuracy_drop: float = 0.02,
    min_throughput_ratio: float = 0.9,
    max_ttft_p95_factor: float = 1.25,
    reference_concurrency: int | None = None,
    max_cost_increase: float | None = None,
    comparison_rounds: int = 3,
    promote_neutral_rebuilds: bool = False,
    force_build: bool = False,
    spec_yaml: str | None = None,
    store: str | None = None,
    mlflow_uri: str | None = None,
    s3_endpoint_url: str | None = None,
) -> RolloutReport | State:
    """Build and promote when the source has something new.

    Args:
        spec_path: build spec YAML on the worker (ignored when `spec` is given)
        spec: an inline build spec
        targets: only these target names (empty: all)
        mode: embedded (units in this process) or cluster (each unit on its target's work pool)
        max_accuracy_drop: largest allowed drop in smoke agreement against the champion (absolute, 0..1)
        min_throughput_ratio: candidate output tok/s at the reference concurrency ≥ this × the champion's
        max_ttft_p95_factor: candidate p95 TTFT at the reference concurrency ≤ this × the champion's
        reference_concurrency: concurrency to compare at (empty: the highest both measured)
        max_cost_increase: $/1M output tokens at the SLO may exceed the champion's by at most this fraction
            (searched units; empty: not compared)
        comparison_rounds: rounds of the side-by-side comparison (champion and candidate benchmarked once each
            per round, alternating) where this worker can serve both; thresholds apply to the ratio's 95% interval
        promote_neutral_rebuilds: promote a rebuild of the champion's weights (toolchain bump) when it is not
            worse; default: only for a gain beyond noise (else "inconclusive: the difference is within noise")
        force_build: build even when the source has nothing new (promotion still needs the gates)
        spec_yaml: the build spec's YAML text, pasted (ignored when `spec` is given); its relative paths resolve
            against the worker's configs/ folder, as for a file there
        store: artifact store; empty: $EF_STORE of the worker, else the spec's
        mlflow_uri: MLflow tracking URI; empty: $MLFLOW_TRACKING_URI of the worker, else the spec's
        s3_endpoint_url: S3 endpoint; empty: $AWS_ENDPOINT_URL_S3 of the worker, else the spec's
    """
    t0 = time.monotonic()
    policy = PromotionPolicy(max_accuracy_drop=max_accuracy_drop, min_throughput_ratio=min_throughput_ratio,
                             max_ttft_p95_factor=max_ttft_p95_factor, reference_concurrency=reference_concurrency,
                             max_cost_increase=max_cost_increase, comparison_rounds=comparison_rounds,
                             rebuild_needs_gain=not promote_neutral_rebuilds)
    try:
        build_spec = flow_spec(spec_path, dict(spec) if spec is not None else None, spec_yaml, store=store,
                               mlflow_uri=mlflow_uri, s3_endpoint_url=s3_endpoint_url)
        build_spec = follow_channel(build_spec)  # the toolchain a followed channel names now, for this rollout
    except InputError as err:
        return input_failure(err)
    with watching():
        return _rollout(build_spec, targets, mode, policy, force_build, t0)


def _rollout(build_spec: BuildSpec, targets: list[str] | None, mode: Mode, policy: PromotionPolicy,
             force_build: bool, t0: float) -> RolloutReport:
    end_orphaned_runs(build_spec)  # units of earlier runs that were cancelled or crashed and never ended theirs
    change = detect_source_change(build_spec, targets or None)
    report_table("rollout-change", build_spec, change.rows(),
                 f"{build_spec.name}: what is new in {change.describe()}")
    to_build = [t.target for t in change.targets if t.changed or force_build]
    summary = None
    if to_build:
        try:
            summary = flow_value(build_engines.with_options(flow_run_name=f"build {build_spec.name} for rollout")(
                spec_path=None, spec=spec_payload(build_spec), targets=to_build, force=False, mode=mode,
                validated=True, store=build_spec.publish.store, mlflow_uri=build_spec.tracking.mlflow_uri,
                s3_endpoint_url=build_spec.publish.s3_endpoint_url))
        except UnitsNotPassed as err:  # the build subflow ended Failed; its units are held below
            summary = err.summary
        if summary.parent_run_id:  # why it built (a new commit, an adapter's new revision, a toolchain bump)
            record_trigger(build_spec, change, summary.parent_run_id)
    else:
        report_markdown("rollout", build_spec, f"## {build_spec.name}: no build\n\nSource "
                        f"`{change.describe()}` is what every target's baseline was built from.\n",
                        "rollout: no build")
    # Champion and candidate of each stem measured side by side here, where this worker can serve them.
    measured = measure_side_by_side(build_spec, targets or None, policy)
    decisions = promote_units(build_spec, targets or None, policy, summary.outcomes if summary else [], measured)
    report_table("promotion", build_spec, [d.row() for d in decisions],
                 f"{build_spec.name}: promote or hold, per alias stem (policy: {policy.model_dump()})")
    comparison = []
    if summary is not None:
        stems = alias_stems(build_spec)
        rebuilt = {stems[u.name] for u in expand_units(build_spec, to_build)}
        comparison = compare_rebuilt(build_spec, decisions, policy, rebuilt, summary.parent_run_id, measured)
        report_table("rollout-comparison", build_spec, [r.row() for r in comparison],
                     f"{build_spec.name}: old vs new per rebuilt target (champion before vs this build)")
    return RolloutReport(spec=build_spec.name, change=change, built=summary is not None,
                         build_ok=summary.ok if summary else None, decisions=decisions, comparison=comparison,
                         side_by_side=measured, build_run_id=summary.parent_run_id if summary else None,
                         duration_s=round(time.monotonic() - t0, 2))
