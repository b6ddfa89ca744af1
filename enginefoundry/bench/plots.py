"""PNG curves: output tokens/s and p95 TTFT against concurrency, one line per scenario or endpoint."""

from __future__ import annotations

from pathlib import Path

from enginefoundry.bench.result import BenchPoint


def plot_sweep(series: dict[str, list[BenchPoint]], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on workers
    import matplotlib.pyplot as plt

    fig, (ax_tput, ax_ttft) = plt.subplots(1, 2, figsize=(10, 4))
    ticks: set[int] = set()
    for label, points in series.items():
        pts = sorted((p for p in points if p.valid), key=lambda p: p.concurrency)
        if not pts:
            continue
        xs = [p.concurrency for p in pts]
        ticks.update(xs)
        ax_tput.plot(xs, [p.output_tokens_per_s or 0 for p in pts], marker="o", label=label)
        ax_ttft.plot(xs, [p.ttft_ms.p95 or 0 for p in pts], marker="o", label=label)
    for ax, ylabel in ((ax_tput, "output tokens/s"), (ax_ttft, "p95 TTFT (ms)")):
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted(ticks))  # concurrency levels are integers; no 2.5 ticks between them
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def series_by_scenario(points: list[BenchPoint]) -> dict[str, list[BenchPoint]]:
    out: dict[str, list[BenchPoint]] = {}
    for p in points:
        out.setdefault(p.scenario, []).append(p)
    return out
