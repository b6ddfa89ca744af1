"""A CLI that scripts well: global options anywhere, --json, completion, validate in one pass, exit 2 with
the field or line for every input error. In process (enginefoundry.cli.main), no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from enginefoundry.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _tiny() -> dict:
    data = yaml.safe_load(TINY.read_text())
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    data["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    return data


@pytest.mark.parametrize("argv", [["-v", "--json", "plan", str(TINY)], ["plan", str(TINY), "-v", "--json"],
                                  ["--json", "plan", "-v", str(TINY)]])
def test_global_options_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.verbose is True and args.json is True


def test_subcommand_without_the_flag_keeps_the_top_level_value() -> None:
    args = build_parser().parse_args(["--json", "validate", str(TINY)])
    assert args.json is True and args.verbose is False


def test_plan_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(TINY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["units"][0]["unit"] == "fp32-tp1.chat.cpu"
    assert "fp32-tp1.chat.cpu" in doc["commands"]


def test_validate_reports_fields_and_input_files_in_one_pass(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny()
    data["variants"][0]["precission"] = "fp16"  # a field problem …
    data["smoke"]["prompts"] = "missing.jsonl"  # … and an input-file problem, reported together
    assert main(["validate", str(_write(tmp_path, data)), "--json"]) == 2
    captured = capsys.readouterr()
    fields = {p["field"] for p in json.loads(captured.out)["problems"]}
    assert {"variants.0.precission", "smoke.prompts"} <= fields
    assert "Traceback" not in captured.err


def test_validate_runs_preflight_and_checks_the_source_and_model_name(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny()
    data["variants"] = [{"precision": "fp8"}]  # the reference lane refuses it: plan does, so must validate
    data["model"]["source"] = str(tmp_path / "no-such-model")
    data["tracking"] = {"registered_model": "org/model"}
    assert main(["validate", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "fp8 is not available on the reference lane" in err
    assert "model.source" in err and "does not exist" in err
    assert "tracking.registered_model" in err and "MLflow registered-model name" in err


def test_validate_prints_effective_settings_and_their_origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.delenv("EF_STORE", raising=False)
    assert main(["validate", str(_write(tmp_path, _tiny())), "--store", "file:///tmp/x", "--json"]) == 0
    dest = json.loads(capsys.readouterr().out)["destinations"]
    assert dest["mlflow_uri"] == {"name": "mlflow_uri", "value": "http://mlflow.example:5000",
                                  "origin": "environment", "detail": "MLFLOW_TRACKING_URI"}
    assert dest["store"]["origin"] == "flag" and dest["store"]["value"] == "file:///tmp/x"


def test_a_prompt_regex_that_does_not_compile_is_exit_2_with_its_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi", "expected": "hello", "match": "exact"}) + "\n"
                       + json.dumps({"id": "b", "prompt": "hi", "expected": "(unclosed", "match": "regex"}) + "\n")
    data = _tiny()
    data["smoke"]["prompts"] = str(prompts)
    assert main(["validate", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "not a valid regular expression" in err


def test_completion_scripts_name_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -o filenames -F _enginefoundry enginefoundry" in script
    for command in ("run", "validate", "plan", "explain", "lineage", "promote", "rollback", "completion"):
        assert f"{command}) opts=" in script
    assert "--json" in script and "--mlflow-uri" in script
    assert main(["completion", "zsh"]) == 0
    assert "bashcompinit" in capsys.readouterr().out


def test_lineage_takes_the_trust_options_its_signature_row_advises() -> None:
    """Issue 33: the signature row says "give --trusted-key PUB or --trust-policy FILE"; lineage takes both."""
    args = build_parser().parse_args(["lineage", "models:/m@cpu-champion", "--trusted-key", "a.pub",
                                      "--trusted-key", "b.pub", "--trust-policy", "p.yaml"])
    assert (args.trusted_key, args.trust_policy) == (["a.pub", "b.pub"], "p.yaml")
