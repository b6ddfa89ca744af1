"""A pre-quantized source (issue 36 item 5): a tiny ModelOpt export, made here with the `simulate` extra
(nvidia-modelopt), plans and runs on the reference lane without a second quantization: its precision is read from
its hf_quant_config.json, a variant that contradicts it is refused before any weight is fetched, the unit key records
the checkpoint's own quantization, the lane serves the checkpoint dequantized, and the real gate judges it against its
dequantized self (and, given the unquantized original, its quantization cost against that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.quantized_source import SourceQuantization, read_quantization, refuse_contradiction
from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import SourceDigests, expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import free_port, serving
from enginefoundry.planning.cache_plan import unit_keys
from enginefoundry.planning.plan_report import plan_report
from enginefoundry.planning.validate import validate_file
from enginefoundry.smoke import load_prompt_set
from enginefoundry.spec import BuildSpec, parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO, TINY_PROMPTS

pytest.importorskip("modelopt", reason="the `simulate` extra (nvidia-modelopt) is not installed")


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the unquantized original, its W4A16_AWQ ModelOpt export), made once for the module (≈15 s)."""
    from tests.support.modelopt_export import make_int4_awq_export

    cases = load_prompt_set(TINY_PROMPTS).cases[:4]
    return make_int4_awq_export(tmp_path_factory.mktemp("modelopt"), [c.chat() for c in cases])


def _spec(tmp: Path, source: Path, precision: str, base: str = "tiny-cpu.yaml",
          **changes: Any) -> dict[str, Any]:  # JSON edge: a spec as YAML data
    data = yaml.safe_load((CONFIGS / base).read_text())
    data["model"] = {"source": str(source), "name": "tiny-prequant"}
    data["variants"] = [{"precision": precision}]
    data["smoke"] = {"prompts": str(TINY_PROMPTS), "max_new_tokens": 6, "small_sample": "warn"}
    data["publish"]["store"] = (tmp / "store").as_uri()
    data.update(changes)
    return data


def _parsed(data: dict[str, Any]) -> BuildSpec:  # JSON edge: a spec as YAML data
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def test_a_contradicting_precision_is_refused_with_the_fix_before_any_work(export: tuple[Path, Path],
                                                                           tmp_path: Path):
    _, exported = export
    spec_file = tmp_path / "bf16.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(tmp_path, exported, "bf16")))
    with pytest.raises(SpecError) as refused:
        validate_file(spec_file)
    fields = dict(refused.value.problems)
    assert "variants.0.precision" in fields
    assert "quant_algo W4A16_AWQ (int4_awq)" in fields["variants.0.precision"]
    assert "set variants.0.precision: int4_awq" in fields["variants.0.precision"]
    # `plan` says the same on the unit, and renders no command for it.
    report = plan_report(_parsed(_spec(tmp_path, exported, "bf16")))
    [row] = report.rows
    assert row["verdict"].startswith("refused: variants.0.precision: bf16 contradicts the source's quantization")
    # The CLI: exit 2, the field and the fix, no traceback.
    proc = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "validate", str(spec_file)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert "set variants.0.precision: int4_awq" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unquantized_original_is_refused_where_it_does_not_apply(export: tuple[Path, Path], tmp_path: Path):
    from enginefoundry.inputs.quantized_source import spec_quantization_problems

    original, exported = export
    plain = _spec(tmp_path, original, "bf16")
    plain["model"]["unquantized"] = str(original)
    assert [f for f, _ in spec_quantization_problems(_parsed(plain))] == ["model.unquantized"]
    twice = _spec(tmp_path, exported, "int4_awq")
    twice["model"]["unquantized"] = str(exported)
    [(field, message)] = spec_quantization_problems(_parsed(twice))
    assert field == "model.unquantized" and "is quantized too (W4A16_AWQ" in message


def test_a_hub_source_is_refused_once_its_config_files_are_fetched_before_its_weights(export: tuple[Path, Path],
                                                                                     tmp_path: Path):
    from tests.services.hub_server import seed_repo
    from tests.services.hub_server import serving as hub_serving

    _, exported = export
    seed_repo(tmp_path / "hub", "nvidia-test/tiny-int4-awq", exported)
    data = _spec(tmp_path, exported, "fp8")
    data["model"]["source"] = "hf://nvidia-test/tiny-int4-awq@main"
    code = ("import json, sys\n"
            "from enginefoundry.inputs.quantized_source import refuse_contradiction\n"
            "from enginefoundry.inputs.sources import fetch\n"
            "from enginefoundry.spec import parse_spec\n"
            "from pathlib import Path\n"
            f"spec = parse_spec(json.loads(sys.argv[1]), source='t', base_dir=Path({str(CONFIGS)!r}))\n"
            "fetch(spec.model.parsed_source(spec.base_path), check=lambda q: refuse_contradiction(spec, q))\n")
    hf_home = tmp_path / "hf-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "EF_CACHE"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_XET="1", EF_CACHE_DIR=str(tmp_path / "ef-cache"),
               PYTHONPATH=str(REPO))
    with hub_serving(tmp_path / "hub") as url:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(data)], env={**env, "HF_ENDPOINT": url},
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "fp8 contradicts the source's quantization" in proc.stderr, proc.stderr
    fetched = {p.name for p in hf_home.rglob("*") if p.is_file() and "snapshots" in p.parts}
    assert {"config.json", "hf_quant_config.json"} <= fetched
    assert "model.safetensors" not in fetched  # refused before a byte of the weights came


def test_the_export_plans_and_runs_on_the_reference_lane_without_a_second_quantization(
        export: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from safetensors.torch import load_file

    from enginefoundry.smoke.simulated import dequantized_checkpoint

    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    original, exported = export
    spec = _parsed(_spec(tmp_path, exported, "int4_awq"))

    # plan: the unit is ok, its conversion dequantizes the export (no quantizer), its reference is its dequantized self
    report = plan_report(spec)
    [row] = report.rows
    assert row["verdict"] == "ok", row["verdict"]
    assert row["reference"].startswith("the pre-quantized int4_awq source, dequantized")
    [commands] = report.commands.values()
    assert "dequantize W4A16_AWQ" in commands[0] and not any("hf_ptq" in c for c in commands)

    # fetch: the quantization is read from the checkpoint; the check sees it; the key records it
    seen: list[SourceQuantization | None] = []
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None,
                     check=lambda q: (seen.append(q), refuse_contradiction(spec, q)))
    assert seen == [snapshot.quantization] and snapshot.quantization is not None
    assert (snapshot.quantization.quant_algo, snapshot.quantization.precision.value) == ("W4A16_AWQ", "int4_awq")
    assert snapshot.quantization.producer.startswith("modelopt ") and snapshot.quantization.group_size == 128
    units = expand_units(spec)
    keyed = unit_keys(spec, units, SourceDigests.of(snapshot))
    plain = unit_keys(spec, units, SourceDigests(weights=snapshot.weights_digest, tokenizer=snapshot.tokenizer_digest))
    [(name, components)] = keyed.components.items()
    assert components.source_quantization == snapshot.quantization.key_json()
    assert keyed.keys[name] != plain.keys[name]  # the checkpoint's own quantization is part of what is built

    # convert: the checkpoint's own codes × scales as plain fp16 weights (the fp32 export computes in fp16): exactly
    # the checkpoint dequantized, never a second quantization of anything
    lane = get_lane(spec.lane)
    [unit] = units
    converted = lane.convert(spec, unit.variant, Path(snapshot.local_dir), tmp_path / "work")
    ckpt = Path(converted.checkpoint_dir)
    assert converted.params["dtype"] == "float16" and converted.params["prequantized"]["quant_algo"] == "W4A16_AWQ"
    assert read_quantization(ckpt) is None and not (ckpt / "hf_quant_config.json").exists()
    deq = dequantized_checkpoint(exported, tokenizer_from=exported, root=tmp_path / "deq", progress=lambda _: None)
    ours, theirs = load_file(ckpt / "model.safetensors"), load_file(deq.folder / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert ours[name].dtype.is_floating_point and str(ours[name].dtype) == "torch.float16"
    assert (ours[name].float() - theirs[name].half().float()).abs().max() == 0
    assert (ckpt / "tokenizer.json").read_bytes() == (exported / "tokenizer.json").read_bytes()

    # build, serve and gate with the pipeline's stages: judged against its dequantized self
    built = lane.build(spec, unit, ckpt, tmp_path / "work")
    assert built.params["dtype"] == "float16"
    cmd = lane.smoke_serve_command(Path(built.bundle_dir), "127.0.0.1", free_port(), spec.model.name,
                                   spec.lane_options)
    cmd.command.env["PYTHONPATH"] = str(REPO)
    ref, outcome = smoke_reference.fn(spec, snapshot.local_dir, snapshot.weights_digest, precision="int4_awq",
                                      checkpoint_dir=str(ckpt))
    assert outcome.simulated is not None and outcome.dtype == "fp16"
    assert outcome.simulated_why is not None and outcome.simulated_why.startswith(
        "the pre-quantized source's own checkpoint (ModelOpt's unified export), dequantized")
    # Given the unquantized original (model.unquantized), the quantization's own cost is judged against it.
    data = _spec(tmp_path, exported, "int4_awq")
    data["model"]["unquantized"] = str(original)
    spec_original = _parsed(data)
    ref_o, outcome_o = smoke_reference.fn(spec_original, snapshot.local_dir, snapshot.weights_digest,
                                          precision="int4_awq", checkpoint_dir=str(ckpt))
    assert outcome_o.key == outcome.key  # the same dequantized reference
    with serving(cmd, tmp_path / "server.log", timeout_s=120) as ep:
        gated = smoke_test.fn(spec, ep, snapshot.local_dir, str(tmp_path / "report"), precision="int4_awq",
                              weights_digest=snapshot.weights_digest, reference=(ref, outcome))
        with_original = smoke_test.fn(spec_original, ep, snapshot.local_dir, str(tmp_path / "report-o"),
                                      precision="int4_awq", weights_digest=snapshot.weights_digest,
                                      reference=(ref_o, outcome_o))
        # The `smoke` command on the export as --reference: judged against it dequantized, without a spec.
        cli = subprocess.run(
            [sys.executable, "-m", "enginefoundry.cli", "smoke", "--endpoint", ep.base_url, "--served-model",
             ep.model_name, "--reference", str(exported), "--prompts", str(TINY_PROMPTS), "--precision", "int4_awq",
             "--small-sample", "warn", "--max-new-tokens", "6", "--unquantized-original", str(original), "--json"],
            capture_output=True, text=True, timeout=600, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert cli.returncode == 0, cli.stderr[-2000:]
    said = json.loads(cli.stdout)
    assert said["verdict"]["reference_why"].startswith("the pre-quantized source's own checkpoint")
    assert "the pre-quantized source (W4A16_AWQ), dequantized," in json.dumps(said["verdict"]["rules"])
    assert gated.passed, gated.verdict.reason
    assert gated.verdict.reference_why.startswith("the pre-quantized source's own checkpoint")
    assert gated.spread is not None and gated.tokenizer_match is True
    rules = {r.name: r for r in gated.verdict.rules}
    assert rules["quantization cost"].kind == "info"
    assert "the source is pre-quantized (W4A16_AWQ" in rules["quantization cost"].detail
    cost = {r.name: r for r in with_original.verdict.rules}["quantization cost"]
    assert cost.kind == "statistical" and "the pre-quantized source (W4A16_AWQ), dequantized," in cost.detail
    assert "vs the fp16 source" in cost.detail


def test_the_trtllm_lane_plans_the_export_without_hf_ptq(export: tuple[Path, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    """Lane trtllm: the PyTorch backend loads the export as it is (TensorRT-LLM docs 'Running Pre-quantized
    Models'), so `plan` renders no ModelOpt quantization and convert hands the export through unchanged."""
    _, exported = export
    data = _spec(tmp_path, exported, "int4_awq", base="llama-3.1-8b-multiarch.yaml")
    data["targets"] = [t for t in data["targets"] if t["arch"] == "sm90"][:1]
    spec = _parsed(data)
    report = plan_report(spec)
    for commands in report.commands.values():
        assert not any("hf_ptq" in c for c in commands), commands
        assert "convert (no PTQ)" in commands[0] and "W4A16_AWQ" in commands[0]
    # The worker's probe asks for no quantizer either, wherever Model-Optimizer is configured.
    monkeypatch.setenv("EF_MODELOPT_DIR", str(tmp_path / "Model-Optimizer"))
    from enginefoundry.lanes.trtllm_flags import HF_PTQ

    assert HF_PTQ not in get_lane("trtllm").tool_commands(spec)
    data["model"]["source"] = str(export[0])  # the unquantized original: the lane quantizes it
    assert HF_PTQ in get_lane("trtllm").tool_commands(_parsed(data))
    [unit, *_] = expand_units(spec)
    converted = get_lane("trtllm").convert(spec, unit.variant, exported, tmp_path / "work")
    assert Path(converted.checkpoint_dir) == exported and converted.params["passthrough"] is True
    assert converted.params["quant_algo"] == "W4A16_AWQ" and not (tmp_path / "work" / "checkpoint").exists()


@pytest.mark.services
def test_an_s3_source_is_refused_after_its_config_objects_before_its_weights(export: tuple[Path, Path], s3, s3_env,
                                                                             unique: str, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """The S3 fetch downloads the config objects first: a contradicting precision stops it before a byte of the
    weights, and leaves no partial folder; an agreeing one fetches the whole export, its quantization recorded."""
    _, exported = export
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    bucket = f"prequant-{unique}"
    s3.create_bucket(Bucket=bucket)
    for f in sorted(exported.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"tiny-int4-awq/{f.name}", Body=f.read_bytes())
    data = _spec(tmp_path, exported, "nvfp4")
    data["model"]["source"] = f"s3://{bucket}/tiny-int4-awq"
    spec = _parsed(data)
    fetched: list[str] = []
    with pytest.raises(SpecError) as refused:
        fetch(spec.model.parsed_source(spec.base_path), progress=fetched.append,
              check=lambda q: refuse_contradiction(spec, q))
    assert [f for f, _ in refused.value.problems] == ["variants.0.precision"]
    names = [line.split("/")[-1].split(" ")[0] for line in fetched if line.startswith("fetch: s3://")]
    assert sorted(names) == ["config.json", "hf_quant_config.json"]  # the weights were never asked for
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no partial folder left behind
    data["variants"] = [{"precision": "int4_awq"}]
    spec = _parsed(data)
    snapshot = fetch(spec.model.parsed_source(spec.base_path), progress=lambda _: None,
                     check=lambda q: refuse_contradiction(spec, q))
    assert snapshot.quantization is not None and snapshot.quantization.quant_algo == "W4A16_AWQ"
    assert (Path(snapshot.local_dir) / "model.safetensors").is_file()
