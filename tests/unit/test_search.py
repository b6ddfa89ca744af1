"""The search section, the searched units (ordinary units, same keys), the SKU and database mapping, the costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.bench.costs import unit_cost
from enginefoundry.bench.result import BenchPoint, Percentiles
from enginefoundry.errors import SpecError
from enginefoundry.inputs.units import SourceDigests, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.search.plan import materialise, profile_for, searched_units
from enginefoundry.search.predictor import AIConfigurator, choose_db_version, system_of
from enginefoundry.spec import Precision, SearchedUnit, Target, Variant, load_spec, parse_spec
from enginefoundry.store.manifest import Manifest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _tiny(**changes) -> dict:
    data = yaml.safe_load((CONFIGS / "tiny-search.yaml").read_text())
    data.update(changes)
    return data


def test_a_search_section_replaces_variants_and_profiles():
    spec = parse_spec(_tiny(), base_dir=CONFIGS)
    assert spec.variants == [] and spec.search is not None and spec.search.top_k == 1
    with pytest.raises(SpecError) as err:
        parse_spec({k: v for k, v in _tiny().items() if k != "search"}, base_dir=CONFIGS)
    assert "add a `search` section" in str(err.value)


def test_search_targets_must_exist():
    data = _tiny()
    data["search"]["targets"] = ["h200"]
    with pytest.raises(SpecError, match=r"search\.targets names unknown targets"):
        parse_spec(data, base_dir=CONFIGS)


def test_cpu_target_falls_back_to_a_measured_search_with_the_reason():
    spec, report = materialise(load_spec(CONFIGS / "tiny-search.yaml"), progress=lambda _: None)
    assert report is not None
    (ts,) = report.targets
    assert not ts.covered and "cpu target" in ts.reason
    (unit,) = expand_units(spec)
    assert unit.name == "fp32-tp1.search-measured.cpu"
    assert unit.searched is not None and unit.searched.predicted is None
    assert unit.searched.note.startswith("measured search: cpu target")
    # Materialising again (a flow payload that carries the decision) changes nothing.
    assert materialise(spec)[0] is spec


def test_searched_units_mix_with_hand_written_ones_and_keep_their_keys():
    """A searched unit is keyed like the same hand-written unit, and one the spec already names is not doubled."""
    data = _tiny(variants=[{"precision": "fp32"}], profiles=[{"name": "chat", "max_batch_size": 4,
                                                               "max_input_len": 128, "max_seq_len": 256}])
    base = parse_spec(data, base_dir=CONFIGS)
    spec, _ = materialise(base, progress=lambda _: None)
    names = [u.name for u in expand_units(spec)]
    assert names == ["fp32-tp1.chat.cpu", "fp32-tp1.search-measured.cpu"]
    searched = expand_units(spec)[1]
    by_hand = base.model_copy(update={"search": None, "profiles": [*base.profiles, searched.profile]})
    twin = next(u for u in expand_units(by_hand) if u.name == searched.name)
    tool = toolchain_identity(spec, {})
    assert key_of(unit_key_components(spec, searched, SourceDigests(weights="w", tokenizer="t"), tool)) == \
        key_of(unit_key_components(by_hand, twin, SourceDigests(weights="w", tokenizer="t"), tool))
    # The same configuration written by hand: one unit, which gains the search's annotation.
    doubled = spec.model_copy(update={"profiles": [*spec.profiles, searched.profile]})
    units = expand_units(doubled)
    assert [u.name for u in units] == ["fp32-tp1.chat.cpu", "fp32-tp1.search-measured.cpu"]
    assert units[1].searched is not None


def test_sku_maps_to_the_predictor_system():
    assert system_of(Target(name="a", arch="sm90", sku=["H200"])) == "h200_sxm"
    assert system_of(Target(name="a", arch="sm90", sku=["NVIDIA H100 PCIe"])) == "h100_pcie"
    assert system_of(Target(name="a", arch="sm90", sku=["H100"])) == "h100_sxm"
    assert system_of(Target(name="a", arch="sm90")) is None


def test_unknown_sku_and_cpu_are_not_covered_with_a_reason():
    spec = load_spec(CONFIGS / "tiny-search.yaml")
    predictor = AIConfigurator(tool=Path("/nonexistent/aiconfigurator"))
    assert "GPUs only" in predictor.coverage(spec, spec.targets[0], {}).reason
    cov = predictor.coverage(spec, Target(name="x", arch="sm90"), {})
    assert not cov.covered and "set targets[].sku" in cov.reason


def test_database_version_disagreement_is_stated():
    assert choose_db_version("1.0.0", ["1.0.0"]) == ("1.0.0", "")
    version, note = choose_db_version("1.2.1", ["1.3.0rc20", "1.3.0rc23"], current="1.3.0rc20")
    assert version == "1.3.0rc20" and "pins TensorRT-LLM 1.2.1" in note and "predicted with 1.3.0rc20" in note
    assert choose_db_version(None, ["1.3.0rc20", "1.3.0rc23"])[0] == "1.3.0rc23"


def test_cost_per_mtok_and_energy():
    spec = load_spec(CONFIGS / "tiny-search.yaml")
    cpu = unit_cost(spec, spec.targets[0], output_tokens_per_s=100.0)
    # 2 cores × $0.04/core-hour = $0.08/hour; 100 tok/s = 360,000 tok/hour → $0.2222 per 1M tokens.
    assert cpu.usd_per_mtok == pytest.approx(0.08 / 0.36)
    assert cpu.tokens_per_joule is None and "energy unavailable" in cpu.why  # never zero
    assert cpu.summary()["energy"] == "unavailable"
    h200 = Target(name="h", arch="sm90", sku=["H200"], gpu_count=2)
    gpu = unit_cost(spec, h200, 1000.0, energy_j=5000.0, window_s=10.0, output_tokens=10_000)
    assert gpu.usd_per_hour == 8.0 and gpu.usd_per_mtok == pytest.approx(8.0 / 3.6)
    assert gpu.tokens_per_joule == 2.0 and gpu.avg_watts_per_gpu == 250.0
    assert "mercatus" in gpu.price_source
    data = _tiny()
    data["search"]["prices"] = {"gpu_hour": {"H200": 2.5}}
    assert unit_cost(parse_spec(data, base_dir=CONFIGS), h200, 1000.0).usd_per_hour == 5.0


def test_price_file_is_read_and_a_bad_one_is_refused(tmp_path):
    data = _tiny()
    data["search"]["prices"] = {"file": str(tmp_path / "prices.yaml")}
    (tmp_path / "prices.yaml").write_text("H200: 3.25\n")
    spec = parse_spec(data, base_dir=CONFIGS)
    h200 = Target(name="h", arch="sm90", sku=["H200"])
    assert unit_cost(spec, h200, 1.0).usd_per_hour == 3.25
    (tmp_path / "prices.yaml").write_text("H200: free\n")
    with pytest.raises(SpecError, match=r"search\.prices\.file"):
        unit_cost(spec, h200, 1.0)


def test_profile_covers_the_workload_spread():
    spec = load_spec(CONFIGS / "tiny-search.yaml")
    p = profile_for(spec.search, 64, "search-b64")
    assert (p.max_batch_size, p.max_input_len, p.max_seq_len) == (64, 36, 52)


def test_a_workload_whose_lengths_file_was_not_read_is_refused_before_profiles_are_sized():
    from enginefoundry.spec.search import Workload

    w = Workload(lengths_file="prompts.jsonl", osl=16)  # built directly, not through parse_spec: isl not filled
    assert w.isl is None
    with pytest.raises(SpecError, match=r"search\.workload\.lengths_file: not read yet"):
        _ = w.mean_isl
    assert Workload(isl=24, osl=16).mean_isl == 24


def test_searched_unit_round_trips_through_a_payload():
    spec, report = materialise(load_spec(CONFIGS / "tiny-search.yaml"), progress=lambda _: None)
    again = parse_spec(spec.model_dump(mode="json"), base_dir=CONFIGS)
    assert [u.name for u in expand_units(again)] == [u.name for u in expand_units(spec)]
    assert searched_units(spec, report)[0] == SearchedUnit(
        target="cpu", variant=Variant(precision=Precision.FP32), profile=spec.searched[0].profile, rank=1,
        note=spec.searched[0].note)


def _point(c: int, ttft: float) -> BenchPoint:
    return BenchPoint(tool="t", scenario="search", concurrency=c, requested=8, completed=8, errors=0,
                      error_rate=0.0, complete=True, output_tokens_per_s=10.0 * c, requests_per_s=1.0,
                      ttft_ms=Percentiles(p95=ttft), itl_ms=Percentiles(p95=10.0), latency_ms=Percentiles(p95=1.0),
                      input_len_avg=24, output_len_avg=16)


def test_goodput_doubles_then_bisects_to_the_highest_load_that_meets_the_slo():
    from enginefoundry.bench.goodput import find_goodput

    spec = load_spec(CONFIGS / "tiny-search.yaml")
    search = spec.search.model_copy(update={"goodput": spec.search.goodput.model_copy(
        update={"max_concurrency": 64, "max_points": 10})})
    seen = []

    def run_at(c):  # the SLO (TTFT p95 ≤ 2000 ms) holds up to c = 11
        seen.append(c)
        return _point(c, 100.0 * c + 900), None

    best, probes, bounded = find_goodput(search, run_at, 1, progress=lambda _: None)
    assert best.concurrency == 11 and bounded == "range"
    assert seen == [1, 2, 4, 8, 16, 12, 10, 11]
    # Bounded: with 3 points it stops at what it found so far, and says so.
    small = search.model_copy(update={"goodput": search.goodput.model_copy(update={"max_points": 3})})
    best, probes, bounded = find_goodput(small, run_at, 1, progress=lambda _: None)
    assert (best.concurrency, len(probes), bounded) == (4, 3, "points")


def test_goodput_starts_no_point_that_would_not_fit_the_time_budget():
    """Seen on the lent H100 (issue 38): 40 requests at c=1 took 100 s of a 120 s budget, and c=2 was started."""
    from enginefoundry.bench.goodput import find_goodput

    spec = load_spec(CONFIGS / "tiny-search.yaml")
    search = spec.search.model_copy(update={"goodput": spec.search.goodput.model_copy(
        update={"max_concurrency": 64, "max_points": 10, "time_budget_s": 120})})
    now = [0.0]
    seen = []

    def run_at(c):
        seen.append(c)
        now[0] += 100.0  # each point takes 100 s
        return _point(c, 100.0), None

    best, probes, bounded = find_goodput(search, run_at, 1, progress=lambda _: None, clock=lambda: now[0])
    assert (seen, best.concurrency, bounded) == ([1], 1, "time")
    # With room for the next point it is measured: 100 s spent, the slowest point 100 s, budget 250 s.
    roomy = search.model_copy(update={"goodput": search.goodput.model_copy(update={"time_budget_s": 250})})
    now[0], seen[:] = 0.0, []
    best, probes, bounded = find_goodput(roomy, run_at, 1, progress=lambda _: None, clock=lambda: now[0])
    assert (seen, [p.concurrency for p in probes], best.concurrency, bounded) == ([1, 2], [1, 2], 2, "time")


def _searched_manifest(usd: float | None, slo: dict | None = None) -> Manifest:
    search = {"goodput_concurrency": 4, "slo": slo or {"ttft_p95_ms": 2000.0, "itl_p95_ms": 500.0},
              "cost": {"usd_per_mtok": usd, "energy": "unavailable"}, "prediction_error": None}
    return Manifest(key="a" * 64, key_components={}, model="m", unit="fp32-tp1.search-measured.cpu",
                    lane="reference", target={}, variant={}, profile={}, source={}, files=[], status="candidate",
                    smoke={"smoke_agreement": 1.0}, benchmark={"points": [], "search": search})


def test_promotion_holds_a_candidate_that_costs_more_at_the_same_slo():
    from enginefoundry.records.promotion import PromotionPolicy, compare

    policy = PromotionPolicy(max_cost_increase=0.1)
    held = compare(_searched_manifest(1.2), _searched_manifest(1.0), policy)
    assert not held.promote and any("×1.20, needs ≤ ×1.10" in r for r in held.reasons)
    assert compare(_searched_manifest(1.05), _searched_manifest(1.0), policy).promote
    other_slo = compare(_searched_manifest(9.0, {"ttft_p95_ms": 1.0}), _searched_manifest(1.0), policy)
    assert other_slo.promote and "SLOs differ" in other_slo.gates[-1].detail
    assert compare(_searched_manifest(9.0), _searched_manifest(1.0), PromotionPolicy()).promote  # off by default


def test_run_summary_and_lineage_show_cost_and_unavailable_energy():
    from enginefoundry.records.lineage import serving_cost
    from enginefoundry.records.run_summary import UnitOutcome, search_rows

    m = _searched_manifest(0.5)
    outcome = UnitOutcome(unit=m.unit, target="cpu", status="candidate", bench=m.benchmark.model_dump(mode="json"))
    (row,) = search_rows([outcome], "cost_per_mtok")
    assert row["$/1M tok"] == "0.5000" and row["tok/J"] == "unavailable" and row["winner"] == "best cost_per_mtok"
    cost = serving_cost(m.benchmark.search)
    assert cost["usd_per_mtok"] == 0.5 and cost["tokens_per_joule"] == "unavailable"
    assert serving_cost(None) is None


def test_ranking_without_a_predicted_power_falls_back_to_tokens_per_gpu_and_says_so():
    from enginefoundry.search.plan import _choose
    from enginefoundry.search.predictor import Coverage, Predicted, Prediction

    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["search"]["objective"] = "tokens_per_joule"
    spec = parse_spec(data, base_dir=CONFIGS)
    h200 = spec.targets[1]

    def cfg(tp, bs, tok):
        return Predicted(precision="fp8", tp=tp, pp=1, batch_size=bs, concurrency=bs, tokens_per_s_gpu=tok,
                         tokens_per_s_user=50.0, ttft_ms=200.0, tpot_ms=19.0)

    pred = Prediction(key="k", precision="fp8", ranked=[cfg(2, 256, 6675.0), cfg(1, 160, 8022.0)], pareto=[])
    ts = _choose(spec, h200, Coverage(True, system="h200_sxm", backend="trtllm", db_version="1.3.0rc20"), [pred],
                 "aiconfigurator")
    assert ts.units[0] == "fp8-tp1.search-b160.h200" and "ranked by tokens_per_gpu" in ts.note


def test_search_command_refuses_a_spec_without_a_search_section_and_plans_the_fallback(capsys):
    from enginefoundry.cli import main

    assert main(["search", str(CONFIGS / "tiny-cpu.yaml")]) == 2
    assert "the spec has no search section" in capsys.readouterr().err
    assert main(["search", str(CONFIGS / "tiny-search.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["targets"][0]["covered"] is False and report["units"][0]["target"] == "cpu"


def test_an_e2e_slo_goes_to_the_predictor_and_its_own_tpot_pairs_are_held_to_the_slo(tmp_path):
    """AIConfigurator 0.12.0 takes `request_latency` in an experiment and then enumerates its own (TTFT, TPOT)
    pairs: the e2e SLO is passed, keyed, and configurations beyond the ITL or TTFT SLO are dropped."""
    from enginefoundry.search.predictor import Coverage, experiment, read_experiment, requests_for

    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text())
    data["search"]["slo"]["e2e_p95_ms"] = 9000
    spec = parse_spec(data, base_dir=CONFIGS)
    cov = Coverage(True, system="h200_sxm", backend="trtllm", db_version="1.3.0rc20")
    (r, *_) = requests_for(spec.search, spec.targets[1], cov, "digest")
    assert experiment(r, tmp_path)["request_latency"] == 9000.0
    without = requests_for(spec.search.model_copy(update={"slo": spec.search.slo.model_copy(
        update={"e2e_p95_ms": None})}), spec.targets[1], cov, "digest")[0]
    assert "request_latency" not in experiment(without, tmp_path) and without.key("v") != r.key("v")
    run = tmp_path / "out" / "run" / "e0"
    run.mkdir(parents=True)
    head = "concurrency,bs,ttft,tpot,tokens/s/gpu,tokens/s/user,tp,pp,power_w\n"
    (run / "best_config_topn.csv").write_text(
        head + f"8,8,{r.ttft_ms / 2},{r.tpot_ms / 2},900,60,1,1,0\n8,8,{r.ttft_ms / 2},{r.tpot_ms * 2},1900,20,1,1,0\n")
    (run / "pareto.csv").write_text(head + "8,8,1,1,900,60,1,1,0\n")
    p = read_experiment(tmp_path / "out", "e0", r, "k", 1.0, 0, "")
    assert [c.tokens_per_s_gpu for c in p.ranked] == [900.0]


def test_the_predictors_pareto_front_travels_with_the_unit_and_is_drawn(tmp_path):
    from enginefoundry.bench.goodput import Probe, SearchVerdict, figure, plot
    from enginefoundry.search.plan import SearchReport, _choose
    from enginefoundry.search.predictor import Coverage, Predicted, Prediction

    spec = parse_spec(yaml.safe_load((CONFIGS / "llama-3.1-8b-search.yaml").read_text()), base_dir=CONFIGS)
    best = Predicted(precision="fp8", tp=1, pp=1, batch_size=160, concurrency=160, tokens_per_s_gpu=8022.0,
                     tokens_per_s_user=50.0, ttft_ms=200.0, tpot_ms=19.0)
    front = [(50.0, 8022.0), (90.0, 3000.0)]
    ts = _choose(spec, spec.targets[1], Coverage(True, system="h200_sxm", backend="trtllm", db_version="1.3.0rc20"),
                 [Prediction(key="k", precision="fp8", ranked=[best], pareto=front)], "aiconfigurator")
    (unit,) = searched_units(spec, SearchReport(objective=spec.search.objective, targets=[ts], seconds=0.0))
    assert unit.pareto == front
    verdict = SearchVerdict(goodput_concurrency=4, bounded_by="range", error_bound=0.3, predicted=best.figures(),
                            probes=[Probe(concurrency=c, met=c < 8, output_tokens_per_s=100.0 * c,
                                          tokens_per_s_gpu=100.0 * c, tokens_per_s_user=100.0 / c, ttft_p95_ms=1.0,
                                          itl_p95_ms=1.0, seconds=1.0) for c in (2, 4, 8)])
    fig = figure(verdict, unit.predictor, "u", unit.pareto)
    lines = {line.get_label(): list(line.get_xydata().tolist()) for line in fig.axes[0].get_lines()}
    assert lines[f"predicted Pareto front ({unit.predictor})"] == [list(p) for p in front]
    assert "measured Pareto front" in lines
    fig.clf()
    assert plot(verdict, unit.predictor, tmp_path / "search.png", "u", unit.pareto).stat().st_size > 0


def test_a_prompt_length_file_gives_the_workload_isl_like_the_lengths_command(tmp_path, capsys):
    from enginefoundry.cli import main
    from enginefoundry.spec.lengths import analyze_lengths

    counts = [10, 20, 30, 40, 100]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"tokens": c}) + "\n" for c in counts))
    data = _tiny()
    data["search"]["workload"] = {"lengths_file": "prompts.jsonl", "osl": 16}
    spec = parse_spec(data, base_dir=tmp_path)
    w = spec.search.workload
    report = analyze_lengths(counts)
    assert (w.isl, w.isl_stddev) == (round(report.mean), round(report.stddev)) == (40, 32)
    assert w.lengths.count == 5 and "prompts.jsonl (5 prompts" in w.source()
    # A payload carries the figures: a worker without the file sees the same workload.
    (tmp_path / "prompts.jsonl").rename(tmp_path / "gone.jsonl")
    again = parse_spec(spec.model_dump(mode="json"), base_dir=tmp_path)
    assert again.search.workload == w
    with pytest.raises(SpecError, match=r"search\.workload\.lengths_file: .*does not exist.*or isl/isl_stddev"):
        parse_spec(data, base_dir=tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    with pytest.raises(SpecError, match=r"search\.workload\.lengths_file: .*needs a tokenizer"):
        parse_spec(data, base_dir=tmp_path)
    data["search"]["workload"]["isl"] = 24
    with pytest.raises(SpecError, match=r"search\.workload: lengths_file and isl exclude each other"):
        parse_spec(data, base_dir=tmp_path)
    del data["search"]["workload"]["lengths_file"], data["search"]["workload"]["isl"]
    with pytest.raises(SpecError, match=r"search\.workload: isl is required.*or lengths_file"):
        parse_spec(data, base_dir=tmp_path)
    # `search` says where the workload came from.
    data["search"]["workload"] = {"lengths_file": str(tmp_path / "gone.jsonl"), "osl": 16}
    data["model"]["source"] = str((CONFIGS / data["model"]["source"]).resolve())
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    assert main(["search", str(tmp_path / "spec.yaml")]) == 0
    assert "workload: ISL from " in capsys.readouterr().out
