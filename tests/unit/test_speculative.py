"""The spec's `speculative` section: its shape, the trtllm lane's `speculative_config` per release (with evidence,
checked by the probe of the fake toolchains), and every refusal before any download (the field and the fix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.toolchain import ToolSurface, UnsupportedByRelease, check_against_surface
from enginefoundry.inputs.units import SourceDigests, expand_units, unit_key_components
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.speculation import tokenizer_problem
from enginefoundry.lanes.trtllm import runtime_config
from enginefoundry.lanes.trtllm_flags import LLM_API, TO_BE_PROBED, flag, llm_api_key_paths, registry_verdict
from enginefoundry.spec import parse_spec
from tests.support.paths import CONFIGS

LLAMA = json.loads((CONFIGS / "model-configs" / "llama-3.1-8b-instruct.json").read_text())
DEEPSEEK_LIKE = {"model_type": "deepseek_v3", "vocab_size": 129280, "num_nextn_predict_layers": 1}
QWEN3 = {"model_type": "qwen3", "vocab_size": 151936}


def spec_for(version: str | None, speculative: dict | None, base_dir=CONFIGS, lane: str | None = None, **fields):
    data = yaml.safe_load((CONFIGS / "llama-3.1-8b-multiarch.yaml").read_text())
    data["toolchain"] = {"trtllm_version": version} if version else {}
    data["variants"] = [{"precision": "bf16"}]
    if speculative is not None:
        data["speculative"] = speculative
    if lane:
        data["lane"] = lane
        data.pop("lane_options", None)
        data["targets"] = [{"name": "cpu", "arch": "cpu", "gpu_count": 0}] if lane == "reference" else data["targets"]
    data.update(fields)
    return parse_spec(data, base_dir=base_dir)


def with_config(tmp_path, config: dict, name: str = "llama-3.1-8b-instruct"):
    """A spec folder whose model-configs/ holds the model's config.json (what `plan` reads before a download)."""
    (tmp_path / "model-configs").mkdir(exist_ok=True)
    (tmp_path / "model-configs" / f"{name}.json").write_text(json.dumps(config))
    return tmp_path


def problems(spec) -> dict[str, str]:
    return dict(get_lane(spec.lane).validate_options(spec))


def yaml_of(spec, version=None, draft_dir=None):
    return runtime_config(spec, expand_units(spec)[0], version, draft_dir)


# --- the section's shape --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "field", "words"), [
    ({"algorithm": "eagle3"}, "speculative", "needs a draft checkpoint"),
    ({"algorithm": "draft_target"}, "speculative", "needs a draft checkpoint"),
    ({"algorithm": "mtp", "draft": "hf://org/draft@main"}, "speculative", "remove speculative.draft"),
    ({"algorithm": "ngram", "num_nextn_predict_layers": 1}, "speculative", "belongs to algorithm mtp"),
    ({"algorithm": "draft_target", "draft": "hf://org/d@v", "one_model": True}, "speculative",
     "belongs to algorithm eagle3"),
    ({"algorithm": "medusa"}, "speculative.algorithm", "draft_target"),
    ({"algorithm": "ngram", "max_draft_len": 0}, "speculative.max_draft_len", "greater than or equal to 1"),
    ({"algorithm": "eagle3", "draft": "ftp://x/y"}, "speculative.draft", "unknown source scheme"),
])
def test_the_section_is_refused_with_its_field(section, field, words):
    with pytest.raises(SpecError) as err:
        spec_for("1.3.0rc24", section)
    assert any(f == field and words in m for f, m in err.value.problems), err.value.problems


# --- the YAML per release --------------------------------------------------------------------------------------

def test_no_section_no_speculative_config():
    assert "speculative_config" not in yaml_of(spec_for("1.3.0rc24", None))


@pytest.mark.parametrize(("version", "expected"), [
    ("1.2.1", {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": "/w/draft",
               "eagle3_one_model": False}),
    ("1.3.0rc24", {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "/w/draft",
                   "eagle3_one_model": False}),
])
def test_eagle3_names_follow_the_release(version, expected):
    spec = spec_for(version, {"algorithm": "eagle3", "draft": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B@abc",
                              "max_draft_len": 4, "one_model": False})
    assert yaml_of(spec, draft_dir="/w/draft")["speculative_config"] == expected
    assert "speculative_config.decoding_type=" + expected["decoding_type"] in llm_api_key_paths(yaml_of(spec))


def test_mtp_ngram_and_draft_target_yaml():
    mtp = spec_for("1.3.0rc24", {"algorithm": "mtp", "num_nextn_predict_layers": 1})
    assert yaml_of(mtp)["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    ngram = spec_for("1.2.1", {"algorithm": "ngram", "max_draft_len": 5, "max_matching_ngram_size": 3})
    assert yaml_of(ngram)["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 5,
                                                     "max_matching_ngram_size": 3}
    dt = spec_for("1.4.0rc4", {"algorithm": "draft_target", "draft": "file:///models/llama-1b"})
    assert yaml_of(dt)["speculative_config"] == {"decoding_type": "Draft_Target", "max_draft_len": 3,
                                                 "speculative_model": "<draft checkpoint>"}


# --- refusals before any download --------------------------------------------------------------------------------

def test_an_algorithm_the_release_lacks_is_refused_with_the_fix():
    found = problems(spec_for("1.2.1", {"algorithm": "draft_target", "draft": "hf://meta-llama/Llama-3.2-1B@main"}))
    msg = found["speculative.algorithm"]
    assert "Draft_Target" in msg and "1.2.1" in msg and "pin toolchain.trtllm_version 1.3.0rc24" in msg
    assert get_lane("trtllm").validate_options(spec_for("1.3.0rc24", None)) == []  # the fix is a pin the lane takes
    assert "eagle3 / mtp / ngram" in msg
    # plan agrees: the registry calls the item absent for 1.2.1
    spec = spec_for("1.2.1", {"algorithm": "draft_target", "draft": "hf://meta-llama/Llama-3.2-1B@main"})
    verdict = registry_verdict(get_lane("trtllm").describe(spec, expand_units(spec)[0]), "1.2.1")
    assert "LLM API option speculative_config.decoding_type=Draft_Target" in verdict.absent


def test_mtp_on_a_model_without_mtp_layers_is_refused(tmp_path):
    found = problems(spec_for("1.3.0rc24", {"algorithm": "mtp"}))  # the Llama config shipped in model-configs/
    assert "no num_nextn_predict_layers" in found["speculative.algorithm"]
    assert "draft_target or ngram" in found["speculative.algorithm"]
    deep = with_config(tmp_path, DEEPSEEK_LIKE)
    assert problems(spec_for("1.3.0rc24", {"algorithm": "mtp"}, base_dir=deep)) == {}
    too_many = problems(spec_for("1.3.0rc24", {"algorithm": "mtp", "num_nextn_predict_layers": 2}, base_dir=deep))
    assert "at most 1" in too_many["speculative.num_nextn_predict_layers"]


def test_eagle3_on_a_family_without_it_is_refused(tmp_path):
    spec = spec_for("1.3.0rc24", {"algorithm": "eagle3", "draft": "hf://org/eagle3-qwen3@v"},
                    base_dir=with_config(tmp_path, QWEN3))
    msg = problems(spec)["speculative.algorithm"]
    assert "model_type qwen3" in msg and "draft_target or ngram" in msg
    ok = spec_for("1.3.0rc24", {"algorithm": "eagle3", "draft": "hf://org/eagle3@v", "one_model": True})
    assert problems(ok) == {}


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 151936}))
    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": str(draft)})
    msg = problems(spec)["speculative.draft"]
    assert "vocab_size 151936" in msg and "128256" in msg and "same model family and tokenizer" in msg
    (draft / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128256}))
    assert problems(spec) == {}
    # after the fetch: the tokenizer files themselves
    assert "differ from the target's" in tokenizer_problem(spec, "a" * 64, "b" * 64)
    assert tokenizer_problem(spec, "a" * 64, "a" * 64) is None


@pytest.mark.parametrize("lane", ["reference", "trtllm-engine"])
def test_lanes_that_do_not_serve_it_refuse_it(lane):
    spec = spec_for("1.2.1", {"algorithm": "ngram"}, lane=lane)
    assert "use lane trtllm" in problems(spec)["speculative.algorithm"]


# --- the probe decides what the registry has no evidence for --------------------------------------------------

def test_plan_names_what_is_to_be_probed_and_the_fake_releases_decide(fake_trtllm):
    spec = spec_for("1.4.0rc4", {"algorithm": "eagle3", "draft": "hf://org/eagle3@v", "one_model": True})
    assert flag(LLM_API, "speculative_config.eagle3_one_model").status("1.4.0rc4") == TO_BE_PROBED
    cmds = get_lane("trtllm").describe(spec, expand_units(spec)[0])
    verdict = registry_verdict(cmds, "1.4.0rc4")
    assert "LLM API option speculative_config.eagle3_one_model" in verdict.to_be_probed and not verdict.absent
    # the 1.4 fake (docs 1.4.0rc4: no eagle3_one_model in Eagle3DecodingConfig) refuses it; 1.3 has it
    with pytest.raises(UnsupportedByRelease, match="eagle3_one_model"):
        check_against_surface(cmds, ToolSurface.model_validate(fake_trtllm.expected_surface("1.4")))
    spec13 = spec_for("1.3.0rc20", {"algorithm": "eagle3", "draft": "hf://org/eagle3@v", "one_model": True})
    check_against_surface(get_lane("trtllm").describe(spec13, expand_units(spec13)[0]),
                          ToolSurface.model_validate(fake_trtllm.expected_surface("1.3")))
    # a decoding_type the installed release lacks: the 1.2 fake has no Eagle3DecodingConfig
    with pytest.raises(UnsupportedByRelease, match="decoding_type=Eagle3"):
        check_against_surface(cmds[-1:], ToolSurface.model_validate(fake_trtllm.expected_surface("1.2")))


# --- the key: the twin keeps its key, speculation and the draft join it ------------------------------------------

def test_a_speculative_unit_is_keyed_apart_from_its_twin():
    twin = spec_for("1.3.0rc24", None)
    sp = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": "hf://meta-llama/Llama-3.2-1B@main"})
    unit = expand_units(twin)[0]

    def comps(spec, draft=None):
        return unit_key_components(spec, unit, SourceDigests(weights="w" * 64, tokenizer="t" * 64, draft=draft), {},
                                   spec.lane_options)

    assert "speculative" not in comps(twin)  # every existing key unchanged
    one, two = comps(sp, ("d" * 64, "t" * 64)), comps(sp, ("e" * 64, "t" * 64))
    assert one["speculative"]["draft_weights_digest"] == "d" * 64 and one != two
    assert "draft" not in one["speculative"]  # the draft's files, never its URI
    with pytest.raises(ValueError, match=r"fetch speculative\.draft first"):
        comps(sp)


# --- the draft is fetched, checked against the fetched target and pinned like the base ---------------------------

def _checkpoint(folder, vocab: int, tokenizer: str):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab}))
    (folder / "tokenizer.json").write_text(tokenizer)
    (folder / "model.safetensors").write_bytes(b"weights of " + folder.name.encode())
    return folder


def test_the_fetched_draft_is_checked_and_pinned(tmp_path):
    from enginefoundry.errors import InputError
    from enginefoundry.inputs.sources import SourceSnapshot, fetch
    from enginefoundry.lanes.speculation import fetch_speculative_draft, pinned_draft
    from enginefoundry.spec import SourceKind, parse_source_uri

    target = fetch(parse_source_uri(str(_checkpoint(tmp_path / "target", 128256, '{"v": 1}'))), progress=str)
    other = _checkpoint(tmp_path / "other", 128256, '{"v": 2}')
    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": str(other)})
    with pytest.raises(InputError, match="tokenizer files"):
        fetch_speculative_draft(spec, target, progress=str)
    same = _checkpoint(tmp_path / "same", 128256, '{"v": 1}')
    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": str(same)})
    draft = fetch_speculative_draft(spec, target, progress=str)
    assert draft is not None
    assert SourceDigests.of(target, draft).draft == (draft.weights_digest, target.tokenizer_digest)
    assert fetch_speculative_draft(spec_for("1.3.0rc24", {"algorithm": "ngram"}), target, progress=str) is None
    # a Hub draft is pinned to the commit fetched, so that every worker fetches the same files
    hub = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": "hf://meta-llama/Llama-3.2-1B@main"})
    snap = SourceSnapshot(uri="hf://meta-llama/Llama-3.2-1B@main", kind=SourceKind.HF, local_dir=str(same),
                          revision="c" * 40, weights_digest="w", tokenizer_digest="t")
    assert pinned_draft(hub, snap).speculative.draft == "hf://meta-llama/Llama-3.2-1B@" + "c" * 40


# --- the gate's lossless rule ------------------------------------------------------------------------------------

def test_the_lossless_rule_compares_every_greedy_answer_with_the_twin():
    from enginefoundry.smoke.gate import LOSSLESS, rule_lossless

    served = [("a", "42", "stop"), ("b", "Paris", "stop")]
    ok = rule_lossless(served, [("b", "Paris", "stop"), ("a", "42", "stop")])
    assert ok.ok and ok.name == LOSSLESS and ok.kind == "hard" and "all 2 greedy answers" in ok.detail
    bad = rule_lossless(served, [("a", "42", "stop"), ("b", "Cairo", "stop")])
    assert not bad.ok and "1 of 2" in bad.detail and "'b'" in bad.detail and "'Cairo'" in bad.detail
    cut = rule_lossless(served, [("a", "42", "length"), ("b", "Paris", "stop")])  # the same text, stopped otherwise
    assert not cut.ok
    never = rule_lossless(served, None, "the lane's server has no non-speculative switch")
    assert not never.ok and never.not_run and "could not compare" in never.detail  # never passed on trust


# --- the benchmark: acceptance rate and speed-up over the twin at each concurrency -------------------------------

def test_the_sweep_records_acceptance_and_speed_up_per_concurrency():
    from enginefoundry.bench import BenchPoint, SweepReport
    from enginefoundry.bench.result import Percentiles, SpeculationPoint

    def point(c, tok_s, spec=None):
        return BenchPoint(tool="aiperf", scenario="short", concurrency=c, requested=8, completed=8, errors=0,
                          error_rate=0.0, complete=True, output_tokens_per_s=tok_s, requests_per_s=1.0,
                          ttft_ms=Percentiles(), itl_ms=Percentiles(), latency_ms=Percentiles(), input_len_avg=24,
                          output_len_avg=16, speculation=spec)

    unit = SweepReport(points=[point(1, 30.0, SpeculationPoint(drafted=30, accepted=27)),
                               point(4, 50.0, SpeculationPoint(drafted=10, accepted=3))],
                       slo=[], exports=[], duration_s=1.0)
    twin = SweepReport(points=[point(1, 20.0), point(4, 100.0)], slo=[], exports=[], duration_s=1.0)
    report = unit.with_twin(twin)
    summary = report.summary()
    assert {k: summary[k] for k in ("spec_acceptance_rate", "spec_speedup_c1", "spec_speedup_c4")} == {
        "spec_acceptance_rate": 0.75, "spec_speedup_c1": 1.5, "spec_speedup_c4": 0.5}
    m = report.points[0].metrics()  # MLflow, step = concurrency; the manifest's benchmark points
    assert m["spec_acceptance_rate"] == 0.9 and m["spec_speedup"] == 1.5 and m["spec_twin_output_tokens_per_s"] == 20
    assert report.table()[1]["speedup"] == 0.5 and "×1.50 at c1, ×0.50 at c4" in report.slo_markdown()
    half = unit.with_twin(SweepReport(points=[point(1, 20.0)], slo=[], exports=[], duration_s=1.0))
    assert "no valid twin point for short-c4" in half.warnings[0] and "spec_speedup_c4" not in half.summary()
    plain = SweepReport(points=[point(1, 20.0)], slo=[], exports=[], duration_s=1.0)
    assert not any(k.startswith("spec_") for k in plain.summary())  # other units: unchanged


# --- the reference lane serves a speculative bundle with its draft -----------------------------------------------

def test_a_speculative_reference_bundle_is_served_with_its_draft(tmp_path):
    from enginefoundry.errors import InputError
    from enginefoundry.lanes.base import BundleInfo, ServeSettings

    lane = get_lane("reference")

    def bundle(**params):
        BundleInfo(lane="reference", unit="u", params={"device": "cpu", **params},
                   serve=ServeSettings(model_dir="model")).write(tmp_path)
        return tmp_path

    b = bundle(speculative="draft_target", draft="draft", max_draft_len=4)
    for cmd in (lane.serve_command(b, "127.0.0.1", 8000), lane.named_serve_command(b, "127.0.0.1", 8000, "tiny"),
                lane.smoke_serve_command(b, "127.0.0.1", 8000, "tiny")):
        argv = cmd.command.argv
        assert "enginefoundry.smoke.serve" in argv and argv[argv.index("--draft") + 1] == str((b / "draft").resolve())
        assert argv[argv.index("--max-draft-len") + 1] == "4" and cmd.shipped  # the benchmarked, shipped server
    with pytest.raises(InputError, match="rebuild it"):
        lane.serve_command(bundle(draft="../elsewhere", max_draft_len=4), "127.0.0.1", 8000)
    plain = lane.serve_command(bundle(), "127.0.0.1", 8000)
    assert "--draft" not in plain.command.argv and "serve" in plain.command.argv  # transformers serve, as before
    spec = spec_for(None, {"algorithm": "draft_target", "draft": "hf://org/draft@v"}, lane="reference")
    described = " ".join(" ".join(c.argv) for c in lane.describe(spec, expand_units(spec)[0]))
    assert "--draft <bundle>/draft --max-draft-len 3" in described and "transformers serve" not in described


# --- lane trtllm's twin: a second trtllm-serve from the YAML without speculative_config --------------------------

def test_lane_trtllm_serves_its_twin_from_the_runtime_yaml_less_speculative_config(tmp_path):
    from enginefoundry.lanes.trtllm import RUNTIME_CONFIG, TWIN_CONFIG, write_runtime_configs
    from enginefoundry.tasks.bench import twin_served_apart

    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": "hf://org/draft@v"})
    cfg = runtime_config(spec, expand_units(spec)[0], "1.3.0rc24", "/drafts/d")
    write_runtime_configs(tmp_path, cfg)
    twin = yaml.safe_load((tmp_path / TWIN_CONFIG).read_text())
    assert "speculative_config" not in twin and {**twin, "speculative_config": cfg["speculative_config"]} == cfg
    (tmp_path / "bundle.json").write_text(json.dumps({"checkpoint": {"path": str(tmp_path)},
                                                      "runtime_config": RUNTIME_CONFIG}))
    lane = get_lane("trtllm")
    own, other = (lane.serve_command(tmp_path, "127.0.0.1", 8000),
                  lane.twin_serve_command(tmp_path, "127.0.0.1", 8001, "m"))
    assert other is not None and other.command.argv[3] == str(tmp_path.resolve() / TWIN_CONFIG)
    assert own.command.argv[3] == str(tmp_path.resolve() / RUNTIME_CONFIG) and "twin" in other.command.description
    assert [a for a in own.command.argv if a not in (own.command.argv[3], "8000")] == \
        [a for a in other.command.argv if a not in (other.command.argv[3], "8001")]  # only the YAML differs
    (tmp_path / TWIN_CONFIG).unlink()
    write_runtime_configs(tmp_path, {k: v for k, v in cfg.items() if k != "speculative_config"})
    assert not (tmp_path / TWIN_CONFIG).exists() and lane.twin_serve_command(tmp_path, "h", 1, "m") is None
    assert twin_served_apart(spec) and not twin_served_apart(spec_for("1.3.0rc24", None))
    ref = spec_for(None, {"algorithm": "draft_target", "draft": "hf://org/draft@v"}, lane="reference")
    assert not twin_served_apart(ref)  # its server has a request switch: the same server is the twin


def test_the_twin_servers_answers_replace_the_lossless_rule_not_run():
    from enginefoundry.smoke import CaseResult, SmokeReport, with_twin_answers
    from enginefoundry.smoke.gate import LOSSLESS, GateRule, GateVerdict, rule_lossless

    cases = [CaseResult(id=i, served=t, reference=t, agree=True, first_n_agree=True, matched_prefix=1,
                        served_correct=None, reference_correct=None, finish_reason="stop")
             for i, t in (("a", "42"), ("b", "Paris"))]
    pending = GateVerdict(passed=False, rules=[GateRule(name="agreement", ok=True, kind="hard", detail="ok"),
                                               rule_lossless([], None, "the lane's server has no switch")])
    report = SmokeReport.model_construct(cases=cases, verdict=pending)
    ok = with_twin_answers(report, [("a", "42", "stop"), ("b", "Paris", "stop")])
    assert ok.passed and [r.name for r in ok.verdict.rules] == ["agreement", LOSSLESS]
    bad = with_twin_answers(report, [("a", "42", "stop"), ("b", "Cairo", "stop")])
    assert not bad.passed and [r.name for r in bad.verdict.failed] == [LOSSLESS] and not pending.rules[0].not_run


def test_the_pipeline_serves_the_twin_after_the_units_server_and_always_stops_it(monkeypatch, tmp_path):
    """flows/unit.py serve_twin: the twin server started (twin=True) only now, asked the smoke prompts, then the
    benchmark's points where the unit was benchmarked, and stopped, also when a stage fails."""
    from enginefoundry.flows import unit as unit_flow
    from enginefoundry.records.outcomes import UnitCommands
    from enginefoundry.records.unit_run import UnitRun

    calls: list[str] = []
    ep = type("Ep", (), {"command": "trtllm-serve twin"})()

    def start(spec, bundle, log_dir, twin=False):
        calls.append(f"start twin={twin}")
        return ep

    monkeypatch.setattr(unit_flow, "start_unit_server", start)
    monkeypatch.setattr(unit_flow, "stop_unit_server", lambda e: calls.append("stop"))
    monkeypatch.setattr(unit_flow, "smoke_twin", lambda spec, e, report, d: calls.append("smoke") or "judged")
    monkeypatch.setattr(unit_flow, "twin_benchmark",
                        lambda spec, e, sweep, d, unit=None: calls.append("bench") or "measured")
    run = UnitRun(key="k", run_id="r", unit_dir=tmp_path, commands=UnitCommands(), stages={"serve": 1.0})
    out = unit_flow.serve_twin(None, None, "b", run, "report", "sweep")
    assert out == ("judged", "measured") and calls == ["start twin=True", "smoke", "bench", "stop"]
    assert run.commands.smoke_serve == ["trtllm-serve twin"] and run.stages["serve"] >= 1.0 and "bench" in run.stages
    calls.clear()
    run = UnitRun(key="k", run_id="r", unit_dir=tmp_path, commands=UnitCommands())
    assert unit_flow.serve_twin(None, None, "b", run, "r", None) == ("judged", None)
    assert calls == ["start twin=True", "smoke", "stop"]  # not benchmarked: no twin sweep
    calls.clear()
    monkeypatch.setattr(unit_flow, "smoke_twin", lambda *a: (_ for _ in ()).throw(RuntimeError("gone")))
    run = UnitRun(key="k", run_id="r", unit_dir=tmp_path, commands=UnitCommands())
    with pytest.raises(RuntimeError):
        unit_flow.serve_twin(None, None, "b", run, "r", None)
    assert calls == ["start twin=True", "stop"] and "smoke" not in run.stages  # a stage that raised has no time


# --- lane trtllm: the draft travels in the bundle ------------------------------------------------------------------

def test_lane_trtllms_draft_is_bundled_named_relative_and_a_tampered_draft_is_refused(tmp_path):
    """The draft is copied into <bundle>/draft; the YAML names it `draft`, relative to the server's working folder,
    which links it (ServeCommand.links; serve.sh's mktemp folder links ${EF_UNIT_DIR}/bundle/draft): no build-host
    path in the unit. Its files are published with the bundle, digested: a tampered draft blob is refused at pull;
    a bundle.json naming a draft outside the bundle is refused at serve."""
    from enginefoundry.errors import InputError, StoreError
    from enginefoundry.inputs.units import key_of
    from enginefoundry.lanes.serve_files import serve_script, serving_plan
    from enginefoundry.lanes.trtllm import BUNDLE_DRAFT_DIR, RUNTIME_CONFIG, bundle_draft, write_runtime_configs
    from enginefoundry.store.backends import FileStore, blob_key
    from enginefoundry.store.publish import find_current, publish_build
    from enginefoundry.store.verify import pull
    from tests.support.paths import TINY_MODEL

    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": "hf://org/draft@v"})
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    draft = bundle_draft(bundle, TINY_MODEL.parent / "draft")
    assert draft == BUNDLE_DRAFT_DIR and (bundle / "draft" / "model.safetensors").is_file()
    write_runtime_configs(bundle, runtime_config(spec, expand_units(spec)[0], "1.3.0rc24", draft))
    assert yaml.safe_load((bundle / RUNTIME_CONFIG).read_text())["speculative_config"]["speculative_model"] == "draft"
    (tmp_path / "ckpt").mkdir()
    info = {"checkpoint": {"path": str(tmp_path / "ckpt")}, "runtime_config": RUNTIME_CONFIG}
    (bundle / "bundle.json").write_text(json.dumps({**info, "params": {"draft": draft}}))
    lane = get_lane("trtllm")
    cmd = lane.serve_command(bundle, "127.0.0.1", 8000)
    assert cmd.links == {"draft": str((bundle / "draft").resolve())}
    plan = serving_plan(lane, bundle, unit="u", model="m", key="k" * 64, artifact_uri="file:///s/u",
                        checkpoint_dir=tmp_path / "ckpt", checkpoint_uri=None)
    assert plan.links == {"draft": "${EF_UNIT_DIR}/bundle/draft"} and str(tmp_path) not in serve_script(plan)
    for hostile, match in (("../elsewhere", "params.draft"), ("model", "not a folder of the bundle")):
        (bundle / "bundle.json").write_text(json.dumps({**info, "params": {"draft": hostile}}))
        with pytest.raises((InputError, ValueError), match=match):
            lane.serve_command(bundle, "127.0.0.1", 8000)

    store = FileStore(f"file://{tmp_path / 'store'}")
    comps = {"k": "draft"}
    fields = dict(key=key_of(comps), key_components=comps, model="m", unit="u", lane="trtllm", target={},
                  variant={}, profile={}, source={}, status="candidate", mlflow_run_id="r")
    result = publish_build(store, "m", fields, {"bundle": bundle}, progress=lambda _: None)
    entry = next(e for e in result.manifest.files if e.path == "bundle/draft/model.safetensors")
    data = bytearray((bundle / "draft" / "model.safetensors").read_bytes())
    data[-1] ^= 1  # same size: only the sha256 tells
    bad = tmp_path / "tampered"
    bad.write_bytes(bytes(data))
    store.delete(blob_key(entry.sha256))
    store.put_file(bad, blob_key(entry.sha256))
    with pytest.raises(StoreError, match=r"bundle/draft/model.safetensors: .* is corrupted"):
        pull(store, find_current(store, "m", result.manifest.key), tmp_path / "down")


# --- the memory estimate counts the draft's weights and the MTP layers --------------------------------------------

def test_the_memory_estimate_counts_the_draft_and_the_mtp_layers(tmp_path):
    from enginefoundry.inputs.model_shape import ModelShape
    from enginefoundry.planning.preflight import GIB, estimate_memory, format_estimates, preflight
    from enginefoundry.spec.speculative import SpeculativeSpec

    draft_dir = tmp_path / "llama-1b"
    draft_dir.mkdir()
    draft_cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                 "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True, "dtype": "bfloat16"}
    (draft_dir / "config.json").write_text(json.dumps(draft_cfg))
    draft = ModelShape.from_config(draft_cfg)
    assert 1.2e9 < draft.param_count() < 1.3e9  # Llama 3.2 1B's 1.24B
    plain = spec_for("1.3.0rc24", None)
    spec = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": str(draft_dir)})
    unit, shape = expand_units(spec)[0], ModelShape.from_config(LLAMA)
    base = estimate_memory(plain, expand_units(plain)[0], shape, 80 * GIB)
    est = estimate_memory(spec, unit, shape, 80 * GIB, draft=draft)
    assert est.speculative_bytes_per_gpu == draft.param_count() * 2  # bf16, whole on the GPU
    assert est.weights_bytes_per_gpu == base.weights_bytes_per_gpu + est.speculative_bytes_per_gpu
    assert est.weights_bytes_total == base.weights_bytes_total + draft.param_count() * 2
    assert est.kv_tokens_fit is not None and base.kv_tokens_fit is not None and est.kv_tokens_fit < base.kv_tokens_fit
    report = preflight(spec, unit, LLAMA, None)  # the local draft's config.json is read at plan time
    assert report.estimates is not None and report.estimates.speculative_bytes_per_gpu == est.speculative_bytes_per_gpu
    assert "incl. the draft_target draft (1236M params) 2.3 GiB" in format_estimates(report)
    hub = spec_for("1.3.0rc24", {"algorithm": "draft_target", "draft": "hf://org/not-cached-draft@v"})
    unknown = preflight(hub, expand_units(hub)[0], LLAMA, None)
    assert unknown.estimates is not None and unknown.estimates.speculative_bytes_per_gpu is None
    assert any("draft config unknown" in n for n in unknown.notes)

    # MTP: num_nextn_predict_layers decoder layers of the target (+ eh_proj), split over tp like its layers.
    mtp = plain.model_copy(update={"speculative": SpeculativeSpec(algorithm="mtp", num_nextn_predict_layers=2)})
    h = shape.hidden_size
    layer = shape.decoder_layer_params()
    assert layer["attention"] + layer["mlp"] + layer["norms"] == (shape.params()["attention"] + shape.params()["mlp"]
                                                                  + shape.params()["norms"] - h) // 32
    one = estimate_memory(mtp, expand_units(mtp)[0], shape, 80 * GIB)
    linear = (layer["attention"] + layer["mlp"] + 2 * h * h) * 2  # bf16
    assert one.speculative_bytes_per_gpu == 2 * (linear + 2 * h * 2) and one.speculative_what == "2 MTP layer(s)"
    tp2 = mtp.model_copy(update={"variants": [mtp.variants[0].model_copy(update={"tp": 2})]})
    split = estimate_memory(tp2, expand_units(tp2)[0], shape, 80 * GIB)
    assert split.speculative_bytes_per_gpu == 2 * (linear // 2 + 2 * h * 2)
    ngram = plain.model_copy(update={"speculative": SpeculativeSpec(algorithm="ngram")})
    assert estimate_memory(ngram, expand_units(ngram)[0], shape, 80 * GIB).speculative_bytes_per_gpu is None
    moe = ModelShape.from_config(json.loads((CONFIGS / "model-configs" / "qwen3-moe-30b-a3b.json").read_text()))
    moe_layer = moe.decoder_layer_params()  # an MoE layer: every routed expert, the router
    assert moe_layer["experts"] == moe.params()["experts"] // moe.num_hidden_layers and moe_layer["experts"] > 0
    assert moe_layer["mlp"] == moe.params()["mlp"] // moe.num_hidden_layers


def test_the_bundled_draft_never_shares_an_inode_with_the_users_draft(tmp_path: Path) -> None:
    """The fetched draft of a local source is the user's own folder (issue 21): copied into the bundle, not linked
    (a hard link let a later write to either reach the other; CI caught the tiny fixture with st_nlink 2)."""
    from enginefoundry.lanes.trtllm import bundle_draft

    user = tmp_path / "draft"
    user.mkdir()
    (user / "config.json").write_text("{}")
    (user / "model.safetensors").write_bytes(b"weights")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert bundle_draft(bundle, user) == "draft"
    for name in ("config.json", "model.safetensors"):
        ours, theirs = (bundle / "draft" / name).stat(), (user / name).stat()
        assert ours.st_ino != theirs.st_ino and theirs.st_nlink == 1, name
        assert (bundle / "draft" / name).read_bytes() == (user / name).read_bytes()
