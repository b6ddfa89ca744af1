"""The reference lane's smoke server (issue 24, item 5): the smoke stage judges the scoring server, which returns
log-probs, unless `lane_options.smoke_server` is `transformers`; the option is not part of a unit's key. The
commands only: the servers run in tests/e2e/test_store_force.py and tests/integration/test_scoring_server.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.units import SourceDigests, expand_units, key_of, toolchain_identity, unit_key_components
from enginefoundry.lanes.reference import ReferenceLane
from enginefoundry.lanes.reference_options import ReferenceOptions
from enginefoundry.records.outcomes import UnitCommands
from enginefoundry.runner import NOT_FOR_TOOLS, tool_env
from enginefoundry.spec import BuildSpec, parse_spec
from tests.support.paths import REPO

SERVE_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _bundle(tmp: Path, device: str = "cpu", max_seq_len: object = 256, max_batch_size: object = 4) -> Path:
    bundle = tmp / "bundle"
    (bundle / "model").mkdir(parents=True)
    params = {"device": device, "max_seq_len": max_seq_len, "max_batch_size": max_batch_size}
    (bundle / "bundle.json").write_text(json.dumps({"params": params}))
    return bundle


def _spec(**lane_options: object) -> BuildSpec:
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    if lane_options:
        data["lane_options"] = lane_options
    return parse_spec(data, base_dir=REPO / "configs")


def test_the_default_smoke_server_is_the_scoring_server_on_the_bundle(tmp_path: Path, monkeypatch):
    bundle = _bundle(tmp_path)
    cmd = ReferenceLane().smoke_serve_command(bundle, "127.0.0.1", 8123, "tiny-chat", _spec().lane_options)
    model = str((bundle / "model").resolve())
    assert cmd.command.argv == [sys.executable, "-m", "enginefoundry.smoke.serve", model, "--host", "127.0.0.1",
                                "--port", "8123", "--name=tiny-chat", "--device", "cpu", "--max-seq-len", "256",
                                "--max-batch", "4"]
    assert cmd.command.env == SERVE_ENV  # the transformers serve command's hygiene
    assert cmd.command.description == "enginefoundry scoring server"
    assert (cmd.model_name, cmd.tokenizer_dir, cmd.links, cmd.shipped) == ("tiny-chat", model, {}, False)
    # The signing key is in neither the command nor the environment the server starts with (model_server).
    for name in NOT_FOR_TOOLS:
        monkeypatch.setenv(name, "secret")
    assert not set(NOT_FOR_TOOLS) & (set(cmd.command.env) | set(tool_env(cmd.command.env)))
    assert "secret" not in cmd.command.shell()


def test_device_and_limits_come_from_the_bundle(tmp_path: Path):
    cmd = ReferenceLane().smoke_serve_command(_bundle(tmp_path, "cuda:0", None, True), "h", 1, "-odd", None)
    argv = cmd.command.argv
    assert argv[argv.index("--device") + 1] == "cuda"
    assert "--max-seq-len" not in argv and "--max-batch" not in argv  # no usable limit recorded: the server's own
    assert "--name=-odd" in argv  # a name that starts with `-` stays a value


def test_smoke_server_transformers_judges_the_shipped_server(tmp_path: Path):
    bundle = _bundle(tmp_path)
    lane = ReferenceLane()
    options = _spec(smoke_server="transformers").lane_options
    cmd = lane.smoke_serve_command(bundle, "127.0.0.1", 8123, "tiny-chat", options)
    assert cmd == lane.named_serve_command(bundle, "127.0.0.1", 8123, "tiny-chat")
    assert cmd.shipped and cmd.command.description == "transformers serve"


def test_the_option_is_typed_and_a_wrong_value_is_refused_with_the_choices():
    assert isinstance(_spec().lane_options, ReferenceOptions)
    assert _spec().lane_options.resolved() == {"smoke_server": "scoring"}
    with pytest.raises(SpecError) as bad:
        _spec(smoke_server="vllm")
    assert "lane_options.smoke_server" in str(bad.value) and "scoring, transformers" in str(bad.value)
    with pytest.raises(SpecError) as unknown:
        _spec(smoke_servr="scoring")
    assert "did you mean smoke_server?" in str(unknown.value)


def test_the_smoke_server_is_not_part_of_the_unit_key():
    """How a build is judged is not what it is: switching the server neither rebuilds nor re-judges."""
    keys = []
    for spec in (_spec(), _spec(smoke_server="transformers"), _spec(smoke_server="scoring")):
        (unit,) = expand_units(spec)
        comps = unit_key_components(spec, unit, SourceDigests(weights="w" * 64, tokenizer="t" * 64),
                                    toolchain_identity(spec, {"torch": "2"}), spec.lane_options)
        assert comps["lane_options"] == {}
        keys.append(key_of(comps))
    assert len(set(keys)) == 1


def test_plan_shows_the_smoke_server_and_the_commands_record_both_servers():
    spec = _spec()
    (unit,) = expand_units(spec)
    described = {c.description.split(" (")[0]: c for c in ReferenceLane().describe(spec, unit)}
    smoke = described["smoke serve"]
    assert smoke.argv[:4] == ["python", "-m", "enginefoundry.smoke.serve", "<bundle>/model"]
    assert "--name=tiny-chat" in smoke.argv and smoke.argv[-4:] == ["--max-seq-len", "256", "--max-batch", "4"]
    assert described["serve"].argv[:3] == ["transformers", "serve", "tiny-chat"]
    plain = _spec(smoke_server="transformers")
    assert "smoke serve" not in {c.description.split(" (")[0] for c in ReferenceLane().describe(plain, unit)}

    commands = UnitCommands()
    commands.add_server("python -m enginefoundry.smoke.serve …", shipped=False)
    commands.add_server("transformers serve …", shipped=True)
    assert commands.tag().splitlines()[-2:] == ["smoke_serve: python -m enginefoundry.smoke.serve …",
                                                "serve: transformers serve …"]
