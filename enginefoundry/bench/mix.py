"""The benchmark's request mix over a unit that serves the base and its LoRA adapters (model.adapter_mode serve).

Each adapter's `traffic_share` (spec) is its part of the requests; the base gets what the shares leave, split evenly
with the adapters that set none. AIPerf 0.13.0 assigns requests to models round-robin over its `--model` list (the nth
to model n mod len: aiperf/dataset/composer/base.py `_select_model_name`; its `weighted` strategy is validated in
config/models.py but that function raises for it), so the shares become a list of at most MAX_SLOTS names, repeated
in proportion and interleaved (smooth weighted round-robin), that the benchmark passes as `--model`.
"""

from __future__ import annotations

from math import gcd

from enginefoundry.spec import BuildSpec

MAX_SLOTS = 20  # names in the round-robin list: shares are kept to 1/20 (5 %)


def served_shares(spec: BuildSpec, base_name: str) -> dict[str, float]:
    """Each served model name's share of the benchmark's requests: the base's name first, then each adapter's."""
    given = {a.name: a.traffic_share for a in spec.model.adapters if a.traffic_share is not None}
    rest = [base_name, *(a.name for a in spec.model.adapters if a.traffic_share is None)]
    each = max(0.0, 1.0 - sum(given.values())) / len(rest)
    return {base_name: each, **{a.name: given.get(a.name, each) for a in spec.model.adapters}}


def round_robin(shares: dict[str, float], slots: int = MAX_SLOTS) -> list[str]:
    """The names in proportion to their shares (every positive share at least once, at most `slots` names, reduced
    by their common divisor) and interleaved, so that any window of the list is close to the mix."""
    total = sum(s for s in shares.values() if s > 0)
    if total <= 0:
        return []
    exact = {n: s / total * slots for n, s in shares.items() if s > 0}
    counts = {n: max(1, int(x)) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: exact[n] - int(exact[n]), reverse=True):  # largest remainders
        if sum(counts.values()) >= slots:
            break
        if exact[n] > int(exact[n]):
            counts[n] += 1
    common = 0
    for c in counts.values():
        common = gcd(common, c)
    counts = {n: c // common for n, c in counts.items()}
    out: list[str] = []
    current = dict.fromkeys(counts, 0)
    for _ in range(sum(counts.values())):  # smooth weighted round-robin (nginx's)
        for n, c in counts.items():
            current[n] += c
        pick = max(current, key=lambda n: current[n])
        current[pick] -= sum(counts.values())
        out.append(pick)
    return out
