"""What the flows show in the Prefect UI (Artifacts tab): the unit matrix, cache hits, gates, where each unit
was published, change detection and promotion decisions. Large outputs appear as URIs only.

Artifact keys group runs of the same spec in the UI's artifact history: `<what>-<spec name>`.
"""

from __future__ import annotations

import re

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from enginefoundry.inputs.units import Unit
from enginefoundry.records.run_summary import RunSummary, best_profiles, search_rows
from enginefoundry.spec import BuildSpec


def artifact_key(what: str, spec_name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return f"{what}-{re.sub(r'[^a-z0-9]+', '-', spec_name.lower()).strip('-')}"[:100]


def report_matrix(spec: BuildSpec, units: list[Unit], keys: dict[str, str], hits: dict[str, bool],
                  placement: dict[str, str]) -> None:
    rows = [{"unit": u.name, "variant": u.variant.name, "profile": u.profile.name, "target": u.target.name,
             "arch": u.target.arch.value, "work pool": u.target.pool, "runs on": placement[u.name],
             "cache": "hit" if hits[u.name] else "miss", "key": keys[u.name][:12], "origin": _origin(u)}
            for u in units]
    create_table_artifact(key=artifact_key("matrix", spec.name), table=rows,
                          description=f"{spec.name}: {len(units)} unit(s), {sum(hits.values())} cache hit(s), "
                                      f"lane {spec.lane}")


def _origin(unit: Unit) -> str:
    """Hand-written, or what the search said: the prediction (tok/s/GPU) or why it fell back to measuring."""
    s = unit.searched
    if s is None:
        return "spec"
    if s.predicted:
        return f"search #{s.rank}: predicted {s.predicted.get('tokens_per_s_gpu', 0):.0f} tok/s/GPU ({s.predictor})"
    return f"search #{s.rank}: {s.note}"


def report_build(spec: BuildSpec, summary: RunSummary) -> None:
    create_table_artifact(key=artifact_key("build-summary", spec.name), table=summary.rows(),
                          description=f"{spec.name}: units, gates, cache hits")
    lines = [f"## {spec.name}: gates and published units", "",
             f"Source `{summary.source_uri}`" + (f" at commit `{summary.source_revision}`"
                                                 if summary.source_revision else ""),
             f"MLflow parent run `{summary.parent_run_id}`", "",
             "| unit | status | smoke agreement | best output tok/s | reason | manifest |", "|---|---|---|---|---|---|"]
    for o in summary.outcomes:
        agreement = o.smoke.smoke_agreement
        best = o.bench.bench_best_output_tokens_per_s
        lines.append(f"| {o.unit} | {o.status}{' (cache hit)' if o.cache_hit else ''} | "
                     f"{'-' if agreement is None else f'{float(agreement):.3f}'} | "
                     f"{'-' if best is None else f'{float(best):.1f}'} | {_cell(o.reason) or '-'} | "
                     f"`{o.manifest_uri or '-'}` |")
    create_markdown_artifact(key=artifact_key("gates", spec.name), markdown="\n".join(lines) + "\n",
                             description=f"{spec.name}: gate verdicts and manifest URIs")
    create_table_artifact(key=artifact_key("best-profiles", spec.name), table=best_profiles(summary.outcomes),
                          description=f"{spec.name}: per target, the profile with the most output tok/s within SLOs")
    searched = search_rows(summary.outcomes, spec.search.objective.value if spec.search else "tokens_per_gpu")
    if searched:
        create_table_artifact(key=artifact_key("search-verified", spec.name), table=searched,
                              description=f"{spec.name}: searched units, goodput at the SLO, predicted vs measured "
                                          "tok/s/GPU, $/1M output tokens, tokens/joule; the winner per target")


def report_unit_links(unit_name: str, key: str, mlflow_run: str, manifest_uri: str | None) -> None:
    """A link artifact from the unit's flow run to its MLflow run (and the manifest), in the Artifacts tab."""
    create_link_artifact(key=f"mlflow-run-{key[:12]}", link=mlflow_run, link_text=f"MLflow run of {unit_name}",
                         description=f"{unit_name}: MLflow run"
                         + (f"; manifest {manifest_uri}" if manifest_uri else ""))


def report_cache_hit(unit_name: str, key: str, built_by: str, manifest_uri: str) -> None:
    """A cache hit links to the run that built the unit."""
    create_link_artifact(key=f"cache-hit-{key[:12]}", link=built_by, link_text=f"run that built {unit_name}",
                         description=f"{unit_name}: cache hit of key {key[:12]}; manifest {manifest_uri}")


def report_table(what: str, spec: BuildSpec, rows: list[dict[str, str]], description: str) -> None:
    create_table_artifact(key=artifact_key(what, spec.name), table=rows, description=description)


def report_markdown(what: str, spec: BuildSpec, markdown: str, description: str) -> None:
    create_markdown_artifact(key=artifact_key(what, spec.name), markdown=markdown, description=description)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:200]
