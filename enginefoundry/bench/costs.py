"""What serving costs: $/GPU-hour by SKU → $ per 1M output tokens at the SLO point; energy → tokens per joule.

The shipped table is a default (the catalog's SKU rows), with its source and date per row; `search.prices` in the
spec (or a YAML file it names) overrides it. A cpu target is charged per core-hour, and its energy is *unavailable*
(None), never zero.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from enginefoundry.catalog import gpu_targets as gpu_catalog
from enginefoundry.catalog.gpu_targets import Price
from enginefoundry.confine import read_regular
from enginefoundry.errors import SpecError
from enginefoundry.spec import BuildSpec, Target


def default_prices() -> list[tuple[str, Price]]:
    """SKU substring (lower case, most specific first) → on-demand $/GPU-hour, with where and when it was read: the
    catalog's SKU rows that carry a default price (enginefoundry/catalog/gpu_targets.py SKUS)."""
    return [(s.needle, s.default_price) for s in gpu_catalog.SKUS if s.default_price]


@dataclass(frozen=True)
class UnitCost:
    """Cost and energy of one unit at its SLO point. None means unavailable, with `why`."""

    usd_per_hour: float | None
    usd_per_mtok: float | None
    tokens_per_joule: float | None
    avg_watts_per_gpu: float | None
    price_source: str
    why: str = ""

    def metrics(self) -> dict[str, float]:
        out = {"usd_per_hour": self.usd_per_hour, "usd_per_mtok": self.usd_per_mtok,
               "tokens_per_joule": self.tokens_per_joule, "avg_watts_per_gpu": self.avg_watts_per_gpu}
        return {k: v for k, v in out.items() if v is not None}

    def summary(self) -> dict[str, object]:
        return {**self.metrics(), "price_source": self.price_source,
                "energy": "unavailable" if self.tokens_per_joule is None else "measured", "why": self.why}


def price_table(spec: BuildSpec) -> list[tuple[str, Price]]:
    """spec `search.prices.gpu_hour` > the prices file > the shipped defaults."""
    prices = spec.search.prices if spec.search else None
    rows: list[tuple[str, Price]] = []
    if prices:
        rows += [(k.lower(), Price(v, "spec search.prices.gpu_hour")) for k, v in prices.gpu_hour.items()]
        if prices.file:
            rows += _file_prices(spec.resolve_path(prices.file), prices.file)
    return rows + default_prices()


PRICES_FILE_MAX_BYTES = 1 << 20  # a table of SKUs is a few hundred bytes


def _file_prices(path: Path, given: str) -> list[tuple[str, Price]]:
    """The prices file: a regular file of at most PRICES_FILE_MAX_BYTES (a FIFO would hang the cost step, /dev/zero
    never end it), a YAML mapping of non-empty SKU names (an empty one is a substring of every SKU) to finite
    positive numbers (not `.inf`, not `true`). SpecError naming the field otherwise (also from `validate`)."""
    def refuse(why: str) -> SpecError:
        return SpecError([("search.prices.file", f"{given}: {why}; give a YAML mapping SKU → $/GPU-hour, "
                                                 "e.g. `h100: 3.0`")])
    try:
        data = yaml.safe_load(read_regular(path, PRICES_FILE_MAX_BYTES).decode())
    except (OSError, ValueError, yaml.YAMLError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
        raise refuse(f"cannot be read ({why})") from None
    if not isinstance(data, dict) or not data:
        raise refuse("not a mapping of SKU names to prices")
    for sku, value in data.items():
        if not isinstance(sku, str | int) or not str(sku).strip():
            raise refuse(f"SKU name {sku!r} is empty or not a name (it would match every SKU)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise refuse(f"{str(sku)!r}: {value!r} is not a positive $/GPU-hour number")
    return [(str(k).strip().lower(), Price(float(v), f"file {given}")) for k, v in data.items()]


def hourly_price(spec: BuildSpec, target: Target) -> tuple[float | None, str]:
    """$/hour for one unit of the target (all its GPUs, or its cores), and where the price came from."""
    if target.arch.value == "cpu":
        prices = spec.search.prices if spec.search else None
        per_core = prices.cpu_core_hour if prices else 0.04
        cores = (prices.cpu_cores if prices else None) or os.cpu_count() or 1
        source = "spec search.prices.cpu_core_hour" if prices else "default $0.04/core-hour"
        return per_core * cores, f"{source} × {cores} core(s)"
    table = price_table(spec)
    for sku in (s.lower() for s in target.sku):
        for needle, price in table:
            if needle in sku:
                return price.usd_per_hour * max(target.gpu_count, 1), price.source
    return None, f"no $/GPU-hour for SKU {target.sku or '(none)'}: set search.prices.gpu_hour"


def unit_cost(spec: BuildSpec, target: Target, output_tokens_per_s: float | None,
              energy_j: float | None = None, window_s: float | None = None,
              output_tokens: float | None = None) -> UnitCost:
    """Cost at the SLO point: $/hour ÷ output tokens per hour × 1e6; energy: tokens ÷ joules over the window."""
    hourly, source = hourly_price(spec, target)
    per_mtok = (hourly / (output_tokens_per_s * 3600) * 1e6
                if hourly is not None and output_tokens_per_s else None)
    why = []
    if hourly is None:
        why.append(source)
    elif not output_tokens_per_s:
        why.append("no output throughput at the SLO point")
    if target.arch.value == "cpu":
        tpj, watts = None, None
        why.append("energy unavailable on a cpu target (no NVML counter)")
    elif energy_j and window_s and output_tokens:
        tpj, watts = output_tokens / energy_j, energy_j / window_s / max(target.gpu_count, 1)
    else:
        tpj, watts = None, None
        why.append("energy unavailable: no NVML energy counter over the benchmark window")
    return UnitCost(usd_per_hour=hourly, usd_per_mtok=per_mtok, tokens_per_joule=tpj, avg_watts_per_gpu=watts,
                    price_source=source, why="; ".join(why))


def cost_per_mtok(spec: BuildSpec, target: Target, tokens_per_s_gpu: float) -> float | None:
    """$/1M output tokens from a per-GPU throughput (the predictor's figure), for ranking."""
    hourly, _ = hourly_price(spec, target)
    if hourly is None or tokens_per_s_gpu <= 0:
        return None
    return hourly / max(target.gpu_count, 1) / (tokens_per_s_gpu * 3600) * 1e6


def energy_mj(gpus: list[int]) -> float | None:
    """NVML's energy counter summed over the GPUs (mJ since the driver loaded; nvmlDeviceGetTotalEnergyConsumption,
    Volta and later); None without NVML or a counter, so energy is reported unavailable, never zero."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return float(sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(i))
                             for i in gpus))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
