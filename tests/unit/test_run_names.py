"""Names and labels (issue 33 §4). A run name a person gave is kept: Prefect's made-up names are told by how
Prefect makes them (coolname's two-word rule, the UI form's Greek-letter names), not by their shape:
`nightly-check` stays. A cpu target's figures are per host, not per GPU."""

from __future__ import annotations

import coolname
import pytest
from prefect.utilities.names import generate_slug

from enginefoundry.flows.build_engines import prefect_generated


@pytest.mark.parametrize("name", ["nightly-check", "hotfix-rebuild", "ui-bad-path", "release-candidate",
                                  "build tiny-cpu", "weekly-rollout"])
def test_a_persons_name_is_kept(name: str) -> None:
    assert not prefect_generated(name)


def test_every_name_prefect_makes_is_recognised() -> None:
    import random

    coolname.replace_random(random.Random(33))  # reproducible
    try:
        names = [generate_slug(2) for _ in range(300)]
    finally:
        coolname.replace_random(random.Random())
    assert all(prefect_generated(n) for n in names), [n for n in names if not prefect_generated(n)]
    assert prefect_generated("delta42-andromedae-nebula") and prefect_generated("omega-lyrae")


def test_a_cpu_targets_figures_are_per_host_not_per_gpu() -> None:
    """Issue 33 §4: CPU targets showed "tok/s/GPU"."""
    from enginefoundry.bench.goodput import SearchVerdict
    from enginefoundry.records.run_summary import UnitOutcome, search_rows

    verdict = SearchVerdict(goodput_concurrency=4, bounded_by="range", error_bound=0.3, per="host",
                            measured={"tokens_per_s_gpu": 120.0})
    assert "tok/s/host" in verdict.markdown("u") and "GPU" not in verdict.markdown("u")
    outcome = UnitOutcome(unit="u", target="cpu", status="candidate", bench={"search": verdict.model_dump()})
    (row,) = search_rows([outcome], "cost_per_mtok")
    assert "tok/s/host meas" in row and not any("GPU" in k for k in row)
