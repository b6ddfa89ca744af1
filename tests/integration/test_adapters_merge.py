"""LoRA adapters in merge mode on the reference lane, end to end on this CPU (issue 36): the tiny model's spec with
the real tiny adapter (tests/fixtures/tiny-chat/adapters/plus-one, trained with PEFT by scripts/make_tiny_lora.py) is
validated, the adapter fetched and merged into the base with PEFT, the merged checkpoint converted and bundled by the
lane, served by the scoring server and judged by the real gate against the adapter's own fp32 reference (the base
with the adapter merged). The reference lane's output of the wrong weights (the base's bundle, served where the
adapter was asked for) is rejected by that gate. The stages' functions, no Prefect run; the whole flow of
configs/tiny-lora.yaml runs in tests/e2e/test_adapters_e2e.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from enginefoundry.inputs.adapters import fetch_adapters, merged_digest, merged_source
from enginefoundry.inputs.sources import fetch
from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import free_port, serving
from enginefoundry.spec import parse_spec
from enginefoundry.tasks.smoke import smoke_reference, smoke_test
from tests.support.paths import CONFIGS, REPO


def _spec(tmp: Path, **model: object):
    data = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())
    data["model"].update(model)
    data["publish"]["store"] = (tmp / "store").as_uri()
    data["tracking"]["mlflow_uri"] = f"sqlite:///{tmp / 'mlflow.db'}"
    data["benchmark"]["enabled"] = False
    return parse_spec(data, source="test spec", base_dir=CONFIGS)


def _judge(spec, bundle: Path, tmp: Path, name: str, source_dir: str, reference):
    lane = get_lane("reference")
    cmd = lane.smoke_serve_command(bundle, "127.0.0.1", free_port(), spec.model.name, spec.lane_options)
    command = cmd.command.model_copy(update={"env": {**cmd.command.env, "PYTHONPATH": str(REPO)}})
    with serving(cmd.model_copy(update={"command": command}), tmp / f"{name}.log", timeout_s=120) as ep:
        return smoke_test.fn(spec, ep, source_dir, str(tmp / name), precision="fp32", reference=reference)


def test_an_adapter_unit_passes_against_its_own_reference_and_the_base_served_in_its_place_is_rejected(
        tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EF_REFERENCE_CACHE", str(tmp_path / "refs"))
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    lane = get_lane("reference")
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapters = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)
    merged = merged_source(base, "plus-one", adapters["plus-one"], progress=str)
    assert merged.weights_digest == merged_digest(base, adapters["plus-one"]) != base.weights_digest
    assert merged.tokenizer_digest == base.tokenizer_digest
    assert merged.identity["adapter"]["weights_digest"] == adapters["plus-one"].weights_digest
    assert not list((tmp_path / "cache" / "merged").glob("*.partial*"))  # renamed into place, nothing left over

    (unit,) = expand_units(spec)
    assert unit.adapter == "plus-one" and unit.name == "fp32-tp1+plus-one.chat.cpu"
    reference = smoke_reference.fn(spec, merged.local_dir, merged.weights_digest, precision="fp32")
    answers = {a.id: a.text for a in reference[0].answers}
    assert answers["add-2-3"].strip() == "6"  # the adapter's own answer (a + b + 1), not the base's 5

    def bundle_of(source_dir: str, name: str) -> Path:
        ckpt = lane.convert(spec, unit.variant, Path(source_dir), tmp_path / name)
        return Path(lane.build(spec, unit, Path(ckpt.checkpoint_dir), tmp_path / name).bundle_dir)

    good = _judge(spec, bundle_of(merged.local_dir, "adapter"), tmp_path, "adapter", merged.local_dir, reference)
    assert good.passed, good.verdict.reason

    # The lane's output of the wrong weights: the base's bundle, served where the adapter was asked for.
    wrong = _judge(spec, bundle_of(base.local_dir, "base"), tmp_path, "base-in-its-place", merged.local_dir,
                   reference)
    assert not wrong.passed
    assert any(r.name.startswith("first-") for r in wrong.verdict.failed), wrong.verdict.reason


def test_a_merge_killed_half_way_leaves_nothing_reused_and_a_finished_one_is_reused(tmp_path: Path, monkeypatch):
    """Crash safety: the merge writes `<digest>.partial-<pid>` and renames it when complete; a partial folder of a
    process that is gone (kill -9) is removed by the next merge, and a complete folder is reused, not merged again."""
    monkeypatch.setenv("EF_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    lane = get_lane("reference")
    base = fetch(spec.model.parsed_source(spec.base_path), progress=str)
    adapter = fetch_adapters(spec, base, lane.name, lane.max_lora_rank, progress=str)["plus-one"]
    dest = tmp_path / "cache" / "merged" / merged_digest(base, adapter)[:16]
    dead = dest.with_name(f"{dest.name}.partial-{2**22 + 7}")  # above the default pid_max: no such process
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half a file")
    said: list[str] = []
    merged = merged_source(base, "plus-one", adapter, progress=said.append)
    assert Path(merged.local_dir) == dest and (dest / ".complete").is_file() and not dead.exists()
    assert (dest / "model.safetensors").stat().st_size > 100_000 and any("merge: adapter plus-one" in s for s in said)
    before = (dest / "model.safetensors").stat().st_mtime_ns
    said.clear()
    assert merged_source(base, "plus-one", adapter, progress=said.append) == merged and said == []
    assert (dest / "model.safetensors").stat().st_mtime_ns == before
