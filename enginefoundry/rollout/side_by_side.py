"""Champion and candidate measured side by side in the rollout that judges them (issue 33: a promotion decided on
one sample each, taken 25 minutes apart on a loaded host, promoted the load, not the toolchain).

Where the rollout's worker can serve the unit (a cpu target: every worker can), both published builds are
pulled (verified), both servers started, and each is benchmarked at the operating point the promotion compares at
in `rounds` rounds, in ABBA order (champion first in even rounds, the candidate first in odd ones), so a load that
drifts during the comparison weighs on both alike. The rounds pair the trials (bench.noise); the promotion rule
then applies its thresholds to the interval of the ratio. Where it cannot serve them (a GPU target on a parent
without that GPU), nothing is measured here and the rule uses the trials each build recorded. No Prefect here.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from enginefoundry.bench.noise import Role, SideBySide, Trial
from enginefoundry.errors import ToolError
from enginefoundry.inputs.units import Unit
from enginefoundry.records.alias_lineage import Lineage, version_lineage
from enginefoundry.records.promotion import (
    PromotionPolicy,
    Registry,
    anchor_of,
    candidate_alias,
    champion_alias,
    manifest_uri_of,
    operating_point,
    read_version_manifest,
)
from enginefoundry.spec import BuildSpec, Scenario
from enginefoundry.store.unit_status import UnitStatus

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

    from enginefoundry.model_server import Endpoint


class PendingComparison(BaseModel):
    """A stem whose candidate the promotion rule will compare with a champion of its own lineage."""

    stem: str
    unit: str
    candidate_version: str
    champion_version: str


def pending_comparison(registry: Registry, model: str, stem: str, unit: str,
                       lineage: Lineage) -> PendingComparison | None:
    """As promotion.decide will find it: a gated candidate newer than the champion, both of this lineage, the
    candidate not rolled back from. None: nothing to compare (decide says why)."""
    from enginefoundry import tracking_tags as mltags

    candidate = registry.version_by_alias(model, candidate_alias(stem))
    champion = registry.version_by_alias(model, champion_alias(stem))
    if candidate is None or champion is None or int(champion.version) >= int(candidate.version):
        return None
    if candidate.tags.get(mltags.ROLLED_BACK_AT) or candidate.tags.get(mltags.STATUS) != UnitStatus.CANDIDATE:
        return None
    if {version_lineage(candidate), version_lineage(champion)} - {None, lineage.digest}:
        return None
    return PendingComparison(stem=stem, unit=unit, candidate_version=str(candidate.version),
                             champion_version=str(champion.version))


def not_servable_here(unit: Unit) -> str | None:
    """Why this worker does not serve the unit for a side-by-side comparison (None: it does)."""
    if unit.target.gpu_count == 0:
        return None
    return (f"target {unit.target.name} needs {unit.target.gpu_count}× {unit.target.arch.value}: compared on the "
            "trials each build recorded")


def measure(spec: BuildSpec, unit: Unit, pending: PendingComparison, registry: Registry, policy: PromotionPolicy,
            work_dir: Path, progress: Callable[[str], None] = print) -> SideBySide:
    """Both builds served here and benchmarked in alternating rounds. Never raises for a failed round: the trial
    is recorded invalid (the rule then has fewer pairs, or none, and says so)."""
    from enginefoundry.bench.aiperf import run_point
    from enginefoundry.lanes import get_lane
    from enginefoundry.model_server import free_port, start_server, stop_server
    from enginefoundry.store.verify import open_build, pull

    model = spec.registered_model_name
    versions: dict[Role, ModelVersion] = {"champion": registry.version(model, pending.champion_version),
                                 "candidate": registry.version(model, pending.candidate_version)}
    manifests = {role: read_version_manifest(model, v) for role, v in versions.items()}
    result = SideBySide(stem=pending.stem, scenario="", concurrency=0, champion_version=pending.champion_version,
                        candidate_version=pending.candidate_version)
    point = operating_point(manifests["candidate"], manifests["champion"], policy)
    scenario = next((s for s in spec.benchmark.scenarios if point is not None and s.name == point[0][0]), None)
    if point is None or scenario is None:
        return result.model_copy(update={"note": "no operating point both builds measured in this spec's scenarios"})
    concurrency = point[0][1]
    result = result.model_copy(update={"scenario": scenario.name, "concurrency": concurrency})
    shutil.rmtree(work_dir, ignore_errors=True)
    lane = get_lane(spec.lane)
    endpoints: dict[Role, Endpoint] = {}
    trials: list[Trial] = []
    try:
        for role, version in versions.items():
            store, build = open_build(manifest_uri_of(version), spec.publish.s3_endpoint_url,
                                      anchor=anchor_of(model, version))
            pull(store, build, work_dir / role)
            cmd = lane.named_serve_command(work_dir / role / "bundle", "127.0.0.1", free_port(), spec.model.name)
            # A folder each: a server's working folder (serve-cwd, where its model name links) lies beside its log.
            endpoints[role] = start_server(cmd, work_dir / f"{role}-server" / "server.log")
            progress(f"compare: {pending.stem}: {role} v{version.version} serving at {endpoints[role].base_url}")
        for r in range(policy.comparison_rounds):
            order: tuple[Role, Role] = ("champion", "candidate") if r % 2 == 0 else ("candidate", "champion")
            for role in order:
                trials.append(_trial(run_point, spec, scenario, concurrency, endpoints[role], role, r,
                                     work_dir / f"round{r}-{role}", progress))
    finally:
        for endpoint in endpoints.values():
            stop_server(endpoint.pid)
    return result.model_copy(update={"trials": trials})


def _trial(run_point: Callable[..., Any], spec: BuildSpec, scenario: Scenario, concurrency: int, endpoint: Endpoint,
           role: Role, r: int, out: Path, progress: Callable[[str], None]) -> Trial:
    try:
        bench, _ = run_point(spec.benchmark, scenario, concurrency, url=endpoint.base_url, model=endpoint.model_name,
                             tokenizer=endpoint.tokenizer_dir, out=out, progress=progress)
    except ToolError as err:
        progress(f"compare: round {r} {role}: {str(err).splitlines()[0]}")
        return Trial(role=role, round=r, valid=False)
    progress(f"compare: round {r} {role}: {bench.output_tokens_per_s or 0:.1f} out tok/s, "
             f"TTFT p95 {bench.ttft_ms.p95 or 0:.0f} ms")
    return Trial(role=role, round=r, output_tokens_per_s=bench.output_tokens_per_s,
                 ttft_ms_p95=bench.ttft_ms.p95, valid=bench.valid)
