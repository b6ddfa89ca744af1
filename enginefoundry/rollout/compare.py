"""Old vs new per target after a rollout rebuilt it (a new source or a toolchain bump): the champion before and the
candidate, with their toolchains, accuracy, output tok/s and p95 TTFT at the same operating point (the one the
promotion rule compares at), the decision and the regressions that held it. No Prefect here."""

from __future__ import annotations

from pydantic import BaseModel, Field

from enginefoundry.bench.noise import SideBySide
from enginefoundry.records.lineage import read_manifest_uri
from enginefoundry.records.promotion import (
    ACCURACY_KEYS,
    NOISE,
    Decision,
    PromotionPolicy,
    Registry,
    compare,
    manifest_uri_of,
    operating_point,
)
from enginefoundry.schemas.manifest import Manifest, ToolchainIdentity


class ComparisonRow(BaseModel):
    target: str = Field(description="the alias stem")
    unit: str
    decision: str
    champion: str | None = None
    candidate: str | None = None
    old_toolchain: str = "-"
    new_toolchain: str = "-"
    operating_point: str = "-"
    accuracy_old: float | None = None
    accuracy_new: float | None = None
    tokens_per_s_old: float | None = None
    tokens_per_s_new: float | None = None
    ttft_p95_ms_old: float | None = None
    ttft_p95_ms_new: float | None = None
    usd_per_mtok_old: float | None = Field(default=None, description="$/1M output tokens at the SLO point (a "
                                                                     "searched unit's verification); None: unknown")
    usd_per_mtok_new: float | None = None
    regressions: list[str] = Field(default_factory=list, description="the failed gates (accuracy, tokens/s, TTFT, "
                                                                     "cost when max_cost_increase is set)")

    def row(self) -> dict[str, str]:
        def pair(old: float | None, new: float | None, fmt: str) -> str:
            return f"{'-' if old is None else format(old, fmt)} → {'-' if new is None else format(new, fmt)}"
        return {"target": self.target, "champion → candidate": f"v{self.champion or '-'} → v{self.candidate or '-'}",
                "toolchain": f"{self.old_toolchain} → {self.new_toolchain}", "at": self.operating_point,
                "accuracy": pair(self.accuracy_old, self.accuracy_new, ".3f"),
                "output tok/s": pair(self.tokens_per_s_old, self.tokens_per_s_new, ".1f"),
                "TTFT p95 ms": pair(self.ttft_p95_ms_old, self.ttft_p95_ms_new, ".0f"),
                "$/1M tok": self.cost_cell(),
                "decision": self.decision, "regressions": "; ".join(self.regressions) or "-"}


    def cost_cell(self) -> str:
        """Old → new $/1M output tokens where both are known; "unavailable" otherwise (never zero)."""
        if self.usd_per_mtok_old is None or self.usd_per_mtok_new is None:
            return "unavailable"
        return f"{self.usd_per_mtok_old:.4g} → {self.usd_per_mtok_new:.4g}"


def describe_toolchain(identity: ToolchainIdentity | None) -> str:
    """One line for a toolchain identity (units.toolchain_identity): release, image digest, lane versions."""
    if identity is None:
        return "-"
    parts = [f"TensorRT-LLM {identity.trtllm_version}"] if identity.trtllm_version else []
    if identity.image_digest:
        parts.append(f"image {identity.image_digest[:19]}")
    parts += [f"{k} {v}" for k, v in sorted((identity.versions or {}).items()) if k != "surface"]
    return ", ".join(parts) or "-"


def _accuracy(manifest: Manifest) -> float | None:
    for key in ACCURACY_KEYS:
        value = manifest.smoke.figure(key)
        if value is not None:
            return value
    return None


def _cost(manifest: Manifest) -> float | None:
    """$/1M output tokens at the SLO point, as the promotion cost gate reads it (promotion.cost_gate)."""
    return manifest.benchmark.usd_per_mtok()


def comparison_row(decision: Decision, candidate: Manifest, champion: Manifest | None,
                   policy: PromotionPolicy, measured: SideBySide | None = None) -> ComparisonRow:
    """The figures the decision was made on: the side-by-side rounds' means (`measured`) where the rollout
    measured both units, else each build's own benchmark point."""
    row = ComparisonRow(target=decision.stem, unit=decision.unit, decision=decision.row()["decision"],
                        champion=decision.champion_before, candidate=decision.candidate_version,
                        new_toolchain=describe_toolchain(candidate.key_components.toolchain),
                        accuracy_new=_accuracy(candidate), usd_per_mtok_new=_cost(candidate))
    if champion is None:
        return row
    verdict = compare(candidate, champion, policy, measured)
    row.old_toolchain = describe_toolchain(champion.key_components.toolchain)
    row.accuracy_old, row.usd_per_mtok_old = _accuracy(champion), _cost(champion)
    row.regressions = [f"cost regression: {g.detail}" if g.name == "cost" else g.detail
                       for g in verdict.gates if not g.ok]
    row.regressions = [r for r in row.regressions if not r.startswith(NOISE)] + (
        [NOISE] if verdict.inconclusive else [])
    if measured is not None and measured.trials:
        old_tok, new_tok = measured.pairs("output_tokens_per_s")
        old_ttft, new_ttft = measured.pairs("ttft_ms_p95")
        row.operating_point = (f"{measured.scenario} c={measured.concurrency}, "
                               f"{len(old_tok)} side-by-side rounds")
        row.tokens_per_s_old, row.tokens_per_s_new = _mean(old_tok), _mean(new_tok)
        row.ttft_p95_ms_old, row.ttft_p95_ms_new = _mean(old_ttft), _mean(new_ttft)
        return row
    point = operating_point(candidate, champion, policy)
    if point is not None:
        (scenario, concurrency), new, old = point
        row.operating_point = f"{scenario} c={concurrency}"
        row.tokens_per_s_new = new.figure("output_tokens_per_s")
        row.tokens_per_s_old = old.figure("output_tokens_per_s")
        row.ttft_p95_ms_new, row.ttft_p95_ms_old = new.figure("ttft_ms_p95"), old.figure("ttft_ms_p95")
    return row


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def comparison_rows(registry: Registry, model: str, decisions: list[Decision], policy: PromotionPolicy,
                    stems: set[str], measured: dict[str, SideBySide] | None = None) -> list[ComparisonRow]:
    """One row per decision of these alias stems that had a candidate (the rebuilt targets)."""
    rows = []
    for d in decisions:
        if d.stem not in stems or d.candidate_version is None:
            continue
        candidate = read_manifest_uri(manifest_uri_of(registry.version(model, d.candidate_version)))
        champion = (read_manifest_uri(manifest_uri_of(registry.version(model, d.champion_before)))
                    if d.champion_before else None)
        rows.append(comparison_row(d, candidate, champion, policy, (measured or {}).get(d.stem)))
    return rows


def markdown(title: str, rows: list[ComparisonRow]) -> str:
    if not rows:
        return f"## {title}\n\nNo target was rebuilt.\n"
    cells = [r.row() for r in rows]
    head = list(cells[0])
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c[h].replace("|", "\\|") for h in head) + " |" for c in cells]
    return "\n".join(lines) + "\n"
