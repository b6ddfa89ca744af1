"""Promotion: is a candidate unit at least as good as the current champion, the registry moves that promote
and roll back (docs/architecture.md#mlflow-schema: aliases `<stem>-candidate`, `<stem>-champion`), and THE
promotion rule (`decide_promotions`) that rollout applies to every alias stem, built or not.

The gates read only what every published manifest carries (smoke summary, benchmark points), so a
decision can be re-derived from the store alone. The registry keeps a per-target champion history as a
registered-model tag, so `rollback` can step back more than once. No Prefect here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from enginefoundry import tracking_tags as mltags
from enginefoundry.bench.noise import SideBySide, gained, gate_state, ratio_interval
from enginefoundry.errors import InputError, StoreError
from enginefoundry.evidence.signing import TrustPolicy, consumer_policy, merged_policy, spec_policy
from enginefoundry.inputs.units import Unit, expand_units
from enginefoundry.records.lineage import read_manifest_uri
from enginefoundry.records.tracking import mlflow_client
from enginefoundry.schemas.manifest import BenchPointPart, Manifest
from enginefoundry.smoke.gate import GateRule, GateVerdict
from enginefoundry.spec import BuildSpec
from enginefoundry.store.layout import legacy_manifest_uri
from enginefoundry.store.unit_status import PASSED_GATES, RegistryStatus, UnitStatus

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

    from enginefoundry.records.alias_lineage import Lineage

NOISE = "inconclusive: the difference is within noise"
GAIN = "better beyond noise"
ACCURACY_KEYS = ("smoke_agreement", "smoke_accuracy")  # agreement with the HF reference, then task accuracy
HISTORY_TAG = mltags.CHAMPION_HISTORY  # registered-model tag: comma-separated champion versions


class PromotionPolicy(BaseModel):
    """When a candidate may replace the champion. Ratios are candidate / champion."""

    max_accuracy_drop: float = Field(default=0.02, ge=0.0, le=1.0,
                                     description="largest allowed absolute drop in smoke agreement/accuracy")
    min_throughput_ratio: float = Field(default=0.9, gt=0.0,
                                        description="output tok/s at the reference concurrency, at least this × "
                                                    "the champion's")
    max_ttft_p95_factor: float = Field(default=1.25, gt=0.0,
                                       description="p95 TTFT at the reference concurrency, at most this × the "
                                                   "champion's")
    reference_concurrency: int | None = Field(default=None, ge=1,
                                              description="concurrency to compare at; default: the highest both "
                                                          "measured")
    rebuild_needs_gain: bool = Field(default=True,
                                     description="a rebuild of the champion's weights (toolchain bump, forced build) "
                                                 "is promoted only when a figure is better beyond noise; off: when "
                                                 "it is not worse, as a new checkpoint")
    comparison_rounds: int = Field(default=3, ge=2, le=20,
                                   description="side-by-side rounds (champion and candidate each benchmarked once "
                                               "per round) where the rollout can serve both units")
    max_cost_increase: float | None = Field(default=None, ge=0.0,
                                            description="$/1M output tokens at the SLO point may exceed the "
                                                        "champion's by at most this fraction (0.1 = 10%); off when "
                                                        "unset; compared only at the same SLO")


class Verdict(GateVerdict):
    """The promotion rule's verdict: the one verdict shape (smoke.gate.GateVerdict: `passed`, one rule per gate),
    read as whether to promote and through which gates. `inconclusive`: held because a difference is within
    noise (no gate failed beyond it)."""

    inconclusive: bool = False

    @property
    def promote(self) -> bool:
        return self.passed

    @property
    def gates(self) -> list[GateRule]:
        return self.rules

    @property
    def reasons(self) -> list[str]:
        """The failing gates (an inconclusive verdict: "inconclusive: …" first, then every gate with its figures);
        when promoted, every gate."""
        failing = [g.detail for g in self.gates if not g.ok]
        if self.inconclusive:
            return [NOISE] + [g.detail.removeprefix(f"{NOISE}: ") for g in self.gates if not g.ok] + [
                g.detail for g in self.gates if g.ok]
        return failing or [g.detail for g in self.gates]


def _points(manifest: Manifest) -> dict[tuple[str, int], BenchPointPart]:
    return {(p.scenario, p.concurrency): p for p in manifest.benchmark.points if p.valid is None or p.valid}


def compare(candidate: Manifest, champion: Manifest | None, policy: PromotionPolicy,
            measured: SideBySide | None = None) -> Verdict:
    """Every gate with its numbers. A rejected candidate never passes; with no champion the candidate's own
    gates (smoke, benchmark validity: its status) decide. `measured`: the rollout's side-by-side rounds of both
    units (bench.noise), which the performance gates then use instead of each build's own figures.

    Three outcomes: promote (every gate passes), held (a gate fails: for performance, a regression beyond noise),
    or inconclusive (held, `Verdict.inconclusive`): a performance threshold lies inside its interval, or the
    candidate is a rebuild of the champion's weights (a toolchain bump, --force-build) whose figures gained
    nothing beyond noise while `policy.rebuild_needs_gain`."""
    gates = [GateRule(name="own gates", ok=candidate.status == UnitStatus.CANDIDATE,
                  detail="smoke and benchmark gates passed" if candidate.status == UnitStatus.CANDIDATE
                  else f"unit is {candidate.status}: {candidate.status_reason or 'gates failed'}")]
    if champion is None:
        gates.append(GateRule(name="champion", ok=True, detail="no champion yet: first promotion"))
        return Verdict(passed=all(g.ok for g in gates), rules=gates)
    gates += _accuracy_gates(candidate, champion, policy)
    performance = _performance_gates(candidate, champion, policy, measured)
    gates += performance
    if policy.max_cost_increase is not None:
        gates.append(cost_gate(candidate, champion, policy.max_cost_increase))
    failed = [g for g in gates if not g.ok and not g.detail.startswith(NOISE)]
    if (not failed and policy.rebuild_needs_gain and same_weights(candidate, champion)
            and not any(GAIN in g.detail for g in performance)):
        gates.append(GateRule(name="gain", ok=False, detail=(
            f"{NOISE}: a rebuild of the champion's weights (toolchain bump or forced build) is promoted only for a "
            "gain beyond noise, and no figure gained (rollout --promote-neutral-rebuilds: promote it when not "
            "worse)")))
    noisy = not failed and any(g.detail.startswith(NOISE) for g in gates)
    return Verdict(passed=all(g.ok for g in gates), rules=gates, inconclusive=noisy)


def same_weights(candidate: Manifest, champion: Manifest) -> bool:
    """Both units were built from the same weights, tokenizer and LoRA adapter(s) (only the toolchain or the build
    differs). A unit of an adapter keys the base's weights digest and the adapter's apart (`key_components.adapter`):
    a new adapter revision is new weights, not a rebuild."""
    def digests(m: Manifest) -> tuple[str | None, str | None, str | None]:
        kc = m.key_components
        adapter = kc.adapter.model_dump_json() if kc.adapter is not None else None
        return (kc.weights_digest or m.source.weights_digest or None,
                kc.tokenizer_digest or m.source.tokenizer_digest or None, adapter)

    mine = digests(candidate)
    return mine[0] is not None and mine == digests(champion)


def cost_gate(candidate: Manifest, champion: Manifest, max_increase: float) -> GateRule:
    """$/1M output tokens at the SLO point (a searched unit's verification), same SLO only. A champion without a
    measured cost is not compared (said so); a candidate without one when the champion has one is held."""
    new_cost, old_cost = candidate.benchmark.usd_per_mtok(), champion.benchmark.usd_per_mtok()
    if old_cost is None:
        return GateRule(name="cost", ok=True, detail="champion has no $/1M tokens at an SLO: cost not compared")
    new_slo = candidate.benchmark.search.slo if candidate.benchmark.search is not None else {}
    old_slo = champion.benchmark.search.slo if champion.benchmark.search is not None else {}
    if new_slo != old_slo:
        return GateRule(name="cost", ok=True, detail=f"SLOs differ ({new_slo} vs {old_slo}): cost not compared")
    if new_cost is None:
        return GateRule(name="cost", ok=False, detail="candidate has no $/1M tokens at the SLO; the champion has")
    ratio = float(new_cost) / float(old_cost)
    return GateRule(name="cost", ok=ratio <= 1 + max_increase + 1e-12,
                detail=f"$/1M output tokens {new_cost:.4g} vs champion {old_cost:.4g} (×{ratio:.2f}, needs ≤ "
                       f"×{1 + max_increase:.2f})")


def _accuracy_gates(candidate: Manifest, champion: Manifest, policy: PromotionPolicy) -> list[GateRule]:
    gates = []
    for key in ACCURACY_KEYS:
        new, old = candidate.smoke.figure(key), champion.smoke.figure(key)
        if new is None or old is None:
            continue
        ok = float(new) >= float(old) - policy.max_accuracy_drop - 1e-12
        gates.append(GateRule(name=key, ok=ok,
                          detail=f"{key} {float(new):.3f} vs champion {float(old):.3f} "
                                 f"(allowed drop {policy.max_accuracy_drop:.3f})"))
    if not gates:
        gates.append(GateRule(name="accuracy", ok=False,
                          detail="no smoke agreement recorded on both units: accuracy cannot be compared"))
    return gates


def _common_points(candidate: Manifest, champion: Manifest, policy: PromotionPolicy) -> list[tuple[str, int]]:
    common = sorted(set(_points(candidate)) & set(_points(champion)))
    if policy.reference_concurrency is not None:
        common = [k for k in common if k[1] == policy.reference_concurrency]
    return common


def operating_point(candidate: Manifest, champion: Manifest,
                    # JSON edge: benchmark points of published manifests
                    policy: PromotionPolicy) -> tuple[tuple[str, int], BenchPointPart, BenchPointPart] | None:
    """The first (scenario, concurrency) the performance gates compare at, with the candidate's and the
    champion's benchmark points there; None when they share none."""
    common = _common_points(candidate, champion, policy)
    if not common:
        return None
    concurrency = max(c for _, c in common)
    key = next(k for k in common if k[1] == concurrency)
    return key, _points(candidate)[key], _points(champion)[key]


def _performance_gates(candidate: Manifest, champion: Manifest, policy: PromotionPolicy,
                       measured: SideBySide | None = None) -> list[GateRule]:
    """Output tok/s and p95 TTFT at the operating point, thresholds applied to the interval of the ratio
    (bench.noise): from the side-by-side rounds when the rollout measured both units, else from each build's
    recorded trials (one sample each for builds that recorded one point: no interval, and the detail says so)."""
    if measured is not None and measured.trials:
        at = f"{measured.scenario} c={measured.concurrency}"
        return _interval_gates(at, measured.pairs("output_tokens_per_s"), measured.pairs("ttft_ms_p95"), True, policy)
    new_pts, old_pts = _points(candidate), _points(champion)
    if not old_pts:
        return [GateRule(name="benchmark", ok=True, detail="champion has no benchmark: performance not compared")]
    common = _common_points(candidate, champion, policy)
    if not common:
        at = f" at concurrency {policy.reference_concurrency}" if policy.reference_concurrency else ""
        return [GateRule(name="benchmark", ok=False,
                     detail=f"no valid benchmark point in common with the champion{at}: performance unproven")]
    concurrency = max(c for _, c in common)
    gates = []
    for scenario, c in (k for k in common if k[1] == concurrency):
        new, old = new_pts[(scenario, c)], old_pts[(scenario, c)]
        gates += _interval_gates(f"{scenario} c={c}", (_trials(old, "output_tokens_per_s"),
                                                       _trials(new, "output_tokens_per_s")),
                                 (_trials(old, "ttft_ms_p95"), _trials(new, "ttft_ms_p95")), False, policy)
    return gates


def _trials(point: BenchPointPart, figure: str) -> list[float]:
    """A point's repeated trials of one figure (`trials`, when its build repeated it), else its one value."""
    values = [t.get(figure) for t in point.trials or []] or [point.figure(figure)]
    return [float(v) for v in values if isinstance(v, int | float) and v > 0]


def _interval_gates(at: str, tok_s: tuple[list[float], list[float]], ttft: tuple[list[float], list[float]],
                    paired: bool, policy: PromotionPolicy) -> list[GateRule]:
    return [_interval_gate(f"{at} output tok/s", tok_s, paired, policy.min_throughput_ratio, True, ".1f"),
            _interval_gate(f"{at} TTFT p95 ms", ttft, paired, policy.max_ttft_p95_factor, False, ".0f")]


def _interval_gate(name: str, samples: tuple[list[float], list[float]], paired: bool, bound: float,
                   higher_is_better: bool, fmt: str) -> GateRule:
    """One figure's gate. kind "statistical": decided on an interval; "info": on one sample a side (no interval).
    `warning`: inconclusive (the bound lies inside the interval)."""
    interval = ratio_interval(samples[0], samples[1], paired=paired)
    if interval is None:
        return GateRule(name=name, ok=False, detail=f"{name}: not measured on both units")
    state = gate_state(interval, bound, higher_is_better=higher_is_better)
    needs = f"needs {'≥' if higher_is_better else '≤'} ×{bound:.2f}"
    detail = f"{name} {interval.describe(fmt)}, {needs}"
    if state == "inconclusive":
        detail = f"{NOISE}: {detail}"
    elif state == "fail" and interval.lo is not None:
        detail = f"{detail}: a regression beyond noise"
    if gained(interval, higher_is_better=higher_is_better):
        detail += f" ({GAIN})"
    return GateRule(name=name, ok=state == "pass", detail=detail,
                    kind="statistical" if interval.lo is not None else "info", warning=state == "inconclusive")


# --------------------------------------------------------------------------------------------- registry


def champion_alias(stem: str) -> str:
    return f"{stem}-champion"


def previous_alias(stem: str) -> str:
    return f"{stem}-previous-champion"


def candidate_alias(stem: str) -> str:
    return f"{stem}-candidate"


class RegistryMove(BaseModel):
    """What a promote or rollback did, for the CLI, the flow's report and MLflow tags."""

    registered_model: str
    stem: str
    action: Literal["promoted", "unchanged", "rolled back"]
    champion: str  # version now behind <stem>-champion
    previous: str | None  # version now behind <stem>-previous-champion
    detail: str


def _unreachable(err: Exception) -> bool:
    """MLflow's REST client reports a server it cannot reach as an MlflowException too: never read it as
    "no such alias"."""
    return "API request to" in str(err) and "failed" in str(err)


class Registry:
    """The champion/candidate aliases of one MLflow registry."""

    def __init__(self, tracking_uri: str) -> None:
        self.uri = tracking_uri
        self.client = mlflow_client(tracking_uri, registry_uri=tracking_uri)

    def version_by_alias(self, model: str, alias: str) -> ModelVersion | None:
        from mlflow.exceptions import MlflowException

        try:
            found: ModelVersion = self.client.get_model_version_by_alias(model, alias)
            return found
        except MlflowException as err:
            if _unreachable(err):
                raise
            return None

    def aliases(self, model: str) -> list[str]:
        """Every alias of the registered model (empty when it does not exist)."""
        from mlflow.exceptions import MlflowException

        try:
            return sorted(self.client.get_registered_model(model).aliases)
        except MlflowException as err:
            if _unreachable(err):
                raise
            return []

    def version(self, model: str, number: str) -> ModelVersion:
        from mlflow.exceptions import MlflowException

        try:
            got: ModelVersion = self.client.get_model_version(model, str(number))
            return got
        except MlflowException as err:
            raise InputError(f"{model} version {number} is not in the registry at {self.uri} "
                             f"({str(err).splitlines()[0][:120]})") from None

    def versions_with(self, model: str, tag: str, value: str) -> list[ModelVersion]:
        """Versions whose tag equals value, newest first. Filtered here: tag names with dots need quoting
        that differs between MLflow stores."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.search_model_versions(f"name = '{model}'", max_results=10_000)
        except MlflowException:
            return []
        return sorted((v for v in found if v.tags.get(tag) == value), key=lambda v: int(v.version), reverse=True)

    def history(self, model: str, stem: str) -> list[str]:
        from mlflow.exceptions import MlflowException

        try:
            tags = self.client.get_registered_model(model).tags
        except MlflowException as err:
            raise InputError(f"registered model {model} is not in the registry at {self.uri} "
                             f"({str(err).splitlines()[0][:120]})") from None
        raw = tags.get(HISTORY_TAG.format(stem=stem), "")
        history = [v for v in raw.split(",") if v]
        if not history:  # promoted before the history existed, or by hand in the MLflow UI
            history = [str(v.version) for v in (self.version_by_alias(model, previous_alias(stem)),
                                                self.version_by_alias(model, champion_alias(stem))) if v is not None]
        return history

    def _save_history(self, model: str, stem: str, history: list[str]) -> None:
        # MLflow tag values are bounded (5000 chars); the recent past is what a rollback needs.
        self.client.set_registered_model_tag(model, HISTORY_TAG.format(stem=stem), ",".join(history[-200:]))

    def tag_version(self, model: str, number: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(model, number, key, value)

    def set_status(self, model: str, number: str, status: RegistryStatus) -> None:
        """The version's `enginefoundry.status` and its MLflow run's: what the registry and the run page show
        follows promotion and rollback."""
        self.client.set_model_version_tag(model, number, mltags.STATUS, status)
        from mlflow.exceptions import MlflowException

        run_id = self.client.get_model_version(model, number).run_id
        if run_id:
            try:
                self.client.set_tag(run_id, mltags.STATUS, status)
            except MlflowException as err:  # a run deleted since: the registry's move stands
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise

    def promote(self, model: str, stem: str, number: str, reason: str) -> RegistryMove:
        """Move `<stem>-champion` to the version; the old champion becomes `<stem>-previous-champion`."""
        version = self.version(model, number)
        number = str(version.version)
        status = version.tags.get(mltags.STATUS, "")
        if status not in PASSED_GATES:
            raise InputError(f"{model} version {number} is '{status or 'untracked'}', not a candidate: a rejected "
                             "unit is never promoted")
        found = self.version_by_alias(model, champion_alias(stem))
        current = str(found.version) if found is not None else None
        if found is not None and current != number:
            self._check_same_lineage(model, stem, version, found)
        history = self.history(model, stem)
        if current == number:
            prev = history[-2] if len(history) > 1 else None
            return RegistryMove(registered_model=model, stem=stem, action="unchanged", champion=number,
                                previous=prev, detail=f"version {number} already is {champion_alias(stem)}")
        before = self.version_by_alias(model, previous_alias(stem))
        self.client.set_registered_model_alias(model, champion_alias(stem), number)
        self.set_status(model, number, RegistryStatus.CHAMPION)
        if current is not None:
            self.client.set_registered_model_alias(model, previous_alias(stem), current)
            self.client.set_model_version_tag(model, current, mltags.SUPERSEDED_BY, number)
            self.set_status(model, current, RegistryStatus.PREVIOUS_CHAMPION)
            if before is not None and str(before.version) not in (current, number):
                self.set_status(model, str(before.version), RegistryStatus.SUPERSEDED)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tags = {mltags.PROMOTED_AT: now, mltags.PROMOTION_REASON: reason[:4000],
                mltags.PREVIOUS_CHAMPION: current or ""}
        self.tag_version(model, number, tags)
        if current is not None and (not history or history[-1] != current):
            history.append(current)
        history.append(number)
        self._save_history(model, stem, history)
        return RegistryMove(registered_model=model, stem=stem, action="promoted", champion=number, previous=current,
                            detail=f"{champion_alias(stem)} → version {number}"
                                   + (f" (was {current})" if current is not None else " (first champion)"))

    def _check_same_lineage(self, model: str, stem: str, version: ModelVersion, champion: ModelVersion) -> None:
        """One lineage per alias (alias_lineage): a version of another unit lineage never takes a champion alias."""
        from enginefoundry.records.alias_lineage import version_label, version_lineage

        mine, theirs = version_lineage(version), version_lineage(champion)
        if mine is not None and theirs is not None and mine != theirs:
            raise InputError(f"{model} version {version.version} ({version_label(version)}) is of another unit "
                             f"lineage than {champion_alias(stem)} v{champion.version} ({version_label(champion)}): "
                             "not promoted; promote it under its own stem (--target) or registered model")

    def _check_restorable(self, model: str, number: str) -> None:
        """The version's manifest must be the one that was published (its digest on the version, in the key's
        pointer history): a build edited in the store is never put back into service. StoreError (exit 1) when it
        cannot be read or differs."""
        version = self.version(model, number)
        if not version.tags.get(mltags.MANIFEST_URI):
            return  # registered outside this project (by hand): no published build to hold it to
        try:
            read_version_manifest(model, version)
        except StoreError as err:
            raise StoreError(f"not rolled back: {model} version {number}: {err}; the aliases are unchanged. "
                             f"Check it with `enginefoundry verify models:/{model}/{number}`, or promote a build "
                             "that verifies (`enginefoundry promote --version N`)") from None

    def rollback(self, model: str, stem: str, check: Callable[[ModelVersion], object] | None = None) -> RegistryMove:
        """Put the previous champion back; the version rolled back from is tagged, and history shrinks by one
        so that a second rollback goes one step further back. `check` (the signature policy) sees the version to
        restore before anything moves, and refuses it by raising."""
        history = self.history(model, stem)
        found = self.version_by_alias(model, champion_alias(stem))
        if found is not None and (not history or history[-1] != str(found.version)):
            history.append(str(found.version))
        if len(history) < 2:
            raise InputError(f"{model} has no previous champion for {stem}: nothing to roll back to "
                             f"(history: {', '.join(history) or 'empty'})")
        dropped = history.pop()
        restored = history[-1]
        self._check_restorable(model, restored)
        if check is not None:
            check(self.version(model, restored))
        self.client.set_registered_model_alias(model, champion_alias(stem), restored)
        self.set_status(model, restored, RegistryStatus.CHAMPION)
        if len(history) > 1:
            self.client.set_registered_model_alias(model, previous_alias(stem), history[-2])
            self.set_status(model, history[-2], RegistryStatus.PREVIOUS_CHAMPION)
        else:
            self.client.delete_registered_model_alias(model, previous_alias(stem))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.client.set_model_version_tag(model, dropped, mltags.ROLLED_BACK_AT, now)
        self.set_status(model, dropped, RegistryStatus.ROLLED_BACK)
        self._save_history(model, stem, history)
        return RegistryMove(registered_model=model, stem=stem, action="rolled back", champion=restored,
                            previous=history[-2] if len(history) > 1 else None,
                            detail=f"{champion_alias(stem)} → version {restored} (was {dropped})")


class Decision(BaseModel):
    """Promote or hold one unit, with every reason."""

    stem: str  # alias prefix (alias_stems): the target name, or target-variant-profile when it has several units
    unit: str
    action: Literal["promoted", "held"]
    candidate_version: str | None = None
    champion_before: str | None = None
    reasons: list[str] = Field(default_factory=list)
    inconclusive: bool = Field(default=False, description="held because a difference is within noise")
    serving_uri: str | None = None
    move: RegistryMove | None = Field(default=None, description="the registry move, when promoted: the flow "
                                                                   "emits its event")

    def row(self) -> dict[str, str]:
        return {"target": self.stem, "unit": self.unit,
                "decision": "held: within noise" if self.inconclusive else self.action,
                "candidate": self.candidate_version or "-", "champion before": self.champion_before or "-",
                "reasons": "; ".join(self.reasons), "serving": self.serving_uri or "-"}


def alias_head(target: str, adapter: str | None) -> str:
    """An alias stem's head: the target's name, `<target>-<adapter>` for a unit of an adapter (a champion per
    adapter, adapter_mode merge)."""
    return f"{target}-{adapter}" if adapter else target


def alias_stems(spec: BuildSpec) -> dict[str, str]:
    """THE alias rule (registration, `promote`, `rollback` and rollout all use it): per unit name, the stem of
    its aliases `<stem>-candidate` / `<stem>-champion`. The target's name when the spec has one unit for that
    target, else `<target>-<variant>-<profile>`, so units of one target never take each other's aliases. It
    depends on the spec only, not on which targets one run builds. A unit of an adapter (adapter_mode merge) has
    `<target>-<adapter>` in place of the target's name: a champion per adapter."""
    units = expand_units(spec)
    per_target = Counter((u.target.name, u.adapter) for u in units)

    def stem(u: Unit) -> str:
        head = alias_head(u.target.name, u.adapter)
        return head if per_target[(u.target.name, u.adapter)] == 1 else \
            f"{head}-{u.variant.name}-{u.profile.name}".replace(".", "-")
    return {u.name: stem(u) for u in units}


def unit_alias_stem(spec: BuildSpec, unit: Unit) -> str:
    return alias_stems(spec)[unit.name]


def manifest_uri_of(version: ModelVersion) -> str:
    """The store URI of a registered version's unit manifest."""
    return version.tags.get(mltags.MANIFEST_URI) or legacy_manifest_uri(version.source or "")


def anchor_of(model: str, version: ModelVersion) -> tuple[str, str]:
    """(where, sha256): the manifest digest a registered version recorded ("" when it predates the tag)."""
    return f"models:/{model}/{version.version}", version.tags.get(mltags.MANIFEST_SHA256, "")


def read_version_manifest(model: str, version: ModelVersion) -> Manifest:
    """A registered version's manifest, held to every digest recorded for it (the version's tag, the key's
    pointer history): StoreError when its bytes changed after it was published."""
    return read_manifest_uri(manifest_uri_of(version), anchor_of(model, version))


@dataclass(frozen=True)
class StemContext:
    """What a rollout knows of one alias stem besides the registry and the policy: `notes` (what this rollout's
    build did with the unit, reported first), the signature policy `trust` its candidate must meet, the unit's
    `lineage` (alias_lineage) and `measured`, the side-by-side rounds of its champion and candidate
    (rollout.side_by_side)."""

    notes: tuple[str, ...] = ()
    trust: TrustPolicy | None = None
    lineage: Lineage | None = None
    measured: SideBySide | None = None


def _other_lineage(held: Decision, stem: str, candidate: ModelVersion, champion: ModelVersion | None,
                   lineage: Lineage, notes: list[str]) -> Decision | None:
    """One lineage per alias (alias_lineage): the decision held when the candidate or the champion is another
    lineage's unit (never judged nor replaced); None when both are the unit's own (or untagged)."""
    from enginefoundry.records.alias_lineage import version_label, version_lineage

    if version_lineage(candidate) not in (None, lineage.digest):
        return held.model_copy(update={"reasons": [*notes, (
            f"{candidate_alias(stem)} is version {candidate.version} of another unit lineage "
            f"({version_label(candidate)}), not {lineage.label}: not promoted")]})
    if champion is not None and version_lineage(champion) not in (None, lineage.digest):
        return held.model_copy(update={"champion_before": None, "reasons": [*notes, (
            f"{champion_alias(stem)} is version {champion.version} of another unit lineage "
            f"({version_label(champion)}): not compared with and not replaced; give this spec its own "
            f"tracking.registered_model, or delete that lineage's aliases {champion_alias(stem)} and "
            f"{candidate_alias(stem)} if this spec replaces it")]})
    return None


def decide(registry: Registry, model: str, stem: str, unit: str, policy: PromotionPolicy,
           context: StemContext | None = None) -> Decision:
    """THE promotion rule for one alias stem: the version behind `<stem>-candidate` (registered when its own gates
    passed), if newer than `<stem>-champion` or with no champion, is compared with the champion and promoted or
    held. Whether this rollout built anything does not matter; `context.notes` (what this rollout's build did) are
    reported first. A rejected unit is never promoted, and a version rolled back from is only put back by hand.
    `context.lineage`: the unit's (alias_lineage); a candidate or champion of another lineage is never compared or
    replaced, and the decision says so."""
    ctx = context or StemContext()
    notes, lineage, measured = list(ctx.notes), ctx.lineage, ctx.measured
    candidate = registry.version_by_alias(model, candidate_alias(stem))
    champion = registry.version_by_alias(model, champion_alias(stem))
    held = Decision(stem=stem, unit=unit, action="held",
                    candidate_version=str(candidate.version) if candidate is not None else None,
                    champion_before=str(champion.version) if champion is not None else None)
    if candidate is None:
        return held.model_copy(update={"reasons": [*notes, f"nothing to promote: no {candidate_alias(stem)}"]})
    if lineage is not None and (other := _other_lineage(held, stem, candidate, champion, lineage, notes)) is not None:
        return other
    compared = ([f"compared with {champion_alias(stem)} v{champion.version} of the same lineage "
                 f"({lineage.label})"] if lineage is not None and champion is not None else [])
    number = str(candidate.version)
    if champion is not None and int(champion.version) >= int(number):
        why = "already is the champion" if str(champion.version) == number \
            else f"is older than champion v{champion.version}"
        return held.model_copy(update={"reasons": [*notes, f"nothing new: candidate v{number} {why}"]})
    if candidate.tags.get(mltags.ROLLED_BACK_AT):
        return held.model_copy(update={"reasons": [*notes, f"candidate v{number} was rolled back from: only "
                                                           "`enginefoundry promote --version` puts it back"]})
    from enginefoundry.evidence.attest import promotion_refusal

    # A signature the policy requires and the candidate lacks refuses it whatever the comparison would say.
    if refusal := promotion_refusal(manifest_uri_of(candidate), ctx.trust):
        return held.model_copy(update={"reasons": [*notes, refusal]})
    cand_manifest = read_version_manifest(model, candidate)
    champ_manifest = read_version_manifest(model, champion) if champion is not None else None
    verdict = compare(cand_manifest, champ_manifest, policy,
                      measured if measured is not None and measured.candidate_version == number else None)
    if not verdict.promote or candidate.tags.get(mltags.STATUS) != UnitStatus.CANDIDATE:
        reasons = verdict.reasons if not verdict.promote else \
            [f"version {number} is tagged '{candidate.tags.get(mltags.STATUS) or 'untracked'}', not a candidate"]
        return held.model_copy(update={"reasons": [*notes, *reasons, *compared],
                                       "inconclusive": verdict.inconclusive})
    move = registry.promote(model, stem, number, "; ".join(g.detail for g in verdict.gates))
    serving = None
    from enginefoundry.lanes.serve_files import SERVE_SH

    if any(f.path == f"serving/{SERVE_SH}" for f in cand_manifest.files):
        # The build to pull (`enginefoundry pull URI DEST`): the store keeps blobs by digest, not the unit folder.
        serving = manifest_uri_of(candidate)
        registry.tag_version(model, number, {mltags.SERVING_URI: serving})
    return held.model_copy(update={"action": "promoted", "serving_uri": serving, "move": move,
                                   "reasons": [*notes, move.detail, *(g.detail for g in verdict.gates), *compared]})


def decide_promotions(spec: BuildSpec, registry: Registry, policy: PromotionPolicy,
                      targets: list[str] | None = None, notes: dict[str, list[str]] | None = None,
                      measured: dict[str, SideBySide] | None = None) -> list[Decision]:
    """`decide` for every alias stem of the spec (only these targets' units, when given), in unit order. `notes`:
    per unit name, what this rollout's build did with it. `measured`: per stem, the side-by-side rounds of its
    champion and candidate (rollout.side_by_side)."""
    from enginefoundry.records.alias_lineage import unit_lineage

    stems = alias_stems(spec)
    trust = merged_policy(consumer_policy(), spec_policy(spec))  # the environment's and the spec's signature policy
    return [decide(registry, spec.registered_model_name, stems[u.name], u.name, policy,
                   StemContext(notes=tuple((notes or {}).get(u.name) or ()), trust=trust, lineage=unit_lineage(spec, u),
                               measured=(measured or {}).get(stems[u.name])))
            for u in expand_units(spec, targets)]
