"""The unit against baseline endpoints (a vLLM server, the current champion …), measured the same way.

Fair comparisons need the same client, dataset, seed, tokenizer and output-length accounting for both
sides (facts/benchmark-tools.md §8), so each baseline gets exactly the unit's sweep: the same spec, and
the unit's tokenizer for token counts. Only the request's `model` differs, discovered from /v1/models.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from enginefoundry.bench.plots import plot_sweep
from enginefoundry.bench.report import ComparisonReport, ComparisonRow, EndpointSweep, SweepReport
from enginefoundry.bench.result import BenchPoint
from enginefoundry.bench.sweep import run_sweep
from enginefoundry.errors import InputError, ToolError
from enginefoundry.spec import BenchmarkSpec


def normalize_base_url(url: str) -> str:
    """'http://h:8000/v1/' → 'http://h:8000': the benchmark clients append /v1/chat/completions themselves."""
    parsed = urllib.parse.urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InputError(f"benchmark.baseline_endpoints: '{url}' is not an http(s) base URL, e.g. http://host:8000")
    path = parsed.path.rstrip("/").removesuffix("/v1")
    return f"{parsed.scheme}://{parsed.netloc}{path}"


def discover_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The model id a server expects in requests: the first entry of GET /v1/models."""
    url = normalize_base_url(base_url) + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise ToolError(f"baseline {base_url}: GET /v1/models answered HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ToolError(f"baseline {base_url} is unreachable: {getattr(err, 'reason', err)}") from None
    except json.JSONDecodeError:
        raise ToolError(f"baseline {base_url}: GET /v1/models did not answer JSON") from None
    models = [m.get("id") for m in payload.get("data", []) if isinstance(m, dict) and m.get("id")]
    if not models:
        raise ToolError(f"baseline {base_url}: GET /v1/models lists no model")
    return str(models[0])


def endpoint_alive(base_url: str) -> Callable[[], bool]:
    """A liveness probe for a server this process did not start (any HTTP answer counts as alive)."""
    url = normalize_base_url(base_url) + "/v1/models"

    def alive() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, OSError):
            return False

    return alive


def _ratio(unit: float | None, base: float | None) -> float | None:
    # Four significant digits, not four decimals: a ratio of 0.0085 would otherwise carry two (±0.6 %).
    return float(f"{unit / base:.4g}") if unit is not None and base else None


def _figures(p: BenchPoint | None) -> tuple[float | None, float | None, float | None]:
    """(output tok/s, TTFT p95, ITL p95) of a valid point; Nones for a missing or invalid one."""
    if p is None or not p.valid:
        return None, None, None
    return p.output_tokens_per_s, p.ttft_ms.p95, p.itl_ms.p95


def _rows(spec: BenchmarkSpec, unit: list[BenchPoint], baseline: EndpointSweep) -> list[ComparisonRow]:
    mine = {(p.scenario, p.concurrency): p for p in unit}
    theirs = {(p.scenario, p.concurrency): p for p in baseline.points}
    rows = []
    for scenario in spec.scenarios:
        for c in spec.concurrency:
            u, b = mine.get((scenario.name, c)), theirs.get((scenario.name, c))
            notes = [f"{side} point {'missing' if p is None else 'invalid'}"
                     for side, p in (("unit", u), ("baseline", b)) if p is None or not p.valid]
            (u_tps, u_ttft, u_itl), (b_tps, b_ttft, b_itl) = _figures(u), _figures(b)
            rows.append(ComparisonRow(
                scenario=scenario.name, concurrency=c, baseline=baseline.label,
                unit_output_tokens_per_s=u_tps, baseline_output_tokens_per_s=b_tps,
                output_tokens_per_s_ratio=_ratio(u_tps, b_tps),
                unit_ttft_p95_ms=u_ttft, baseline_ttft_p95_ms=b_ttft, ttft_p95_ratio=_ratio(u_ttft, b_ttft),
                unit_itl_p95_ms=u_itl, baseline_itl_p95_ms=b_itl, itl_p95_ratio=_ratio(u_itl, b_itl),
                note="; ".join(notes),
            ))
    return rows


def _labels(urls: list[str]) -> list[str]:
    labels: list[str] = []
    for url in urls:
        base = urllib.parse.urlparse(url).netloc or url
        label = base if base not in labels else f"{base}#{len(labels) + 1}"
        labels.append(label)
    return labels


def compare_with_baselines(
    spec: BenchmarkSpec, unit: SweepReport, *, unit_label: str, unit_url: str, unit_model: str, tokenizer: str,
    out: Path, baselines: list[str] | None = None, progress: Callable[[str], None] = print,
    extra_inputs: dict[str, str] | None = None,
) -> ComparisonReport:
    """Run the unit's sweep against every baseline URL and report unit/baseline ratios and one plot.

    `baselines` defaults to spec.baseline_endpoints. A baseline that cannot be reached is recorded with
    the reason; it never fails the unit. No GPU telemetry for baselines: their GPUs are not this host's.
    """
    urls = [normalize_base_url(u) for u in (spec.baseline_endpoints if baselines is None else baselines)]
    out.mkdir(parents=True, exist_ok=True)
    endpoints = [EndpointSweep(label=unit_label, url=unit_url, model=unit_model, points=unit.points,
                               failures=unit.failures)]
    rows: list[ComparisonRow] = []
    for label, url in zip(_labels(urls), urls, strict=True):
        try:
            model = discover_model(url)
        except ToolError as err:
            progress(f"bench: {err}")
            baseline = EndpointSweep(label=label, url=url, model=None, failures=[str(err)])
        else:
            progress(f"bench: baseline {label} serves '{model}'; running the same sweep")
            sweep = run_sweep(spec, url=url, model=model, tokenizer=tokenizer, out=out / _slug(label),
                              progress=progress, server_alive=endpoint_alive(url), telemetry=False,
                              extra_inputs=extra_inputs)
            baseline = EndpointSweep(label=label, url=url, model=model, points=sweep.points,
                                     failures=sweep.failures)
        endpoints.append(baseline)
        rows.extend(_rows(spec, unit.points, baseline))
    report = ComparisonReport(unit=unit_label, endpoints=endpoints, rows=rows)
    if any(p.valid for e in endpoints for p in e.points):
        multi = len(spec.scenarios) > 1
        series = {(f"{e.label} · {s.name}" if multi else e.label): [p for p in e.points if p.scenario == s.name]
                  for e in endpoints for s in spec.scenarios}
        report.plot = str(plot_sweep(series, out / "comparison.png", f"{unit_label} vs baselines"))
    (out / "comparison.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    (out / "comparison.md").write_text(report.markdown())
    return report


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in label)
