"""`enginefoundry smoke` against a real `transformers serve`: exit 0 pass, 1 rejected (rule named), 2 bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginefoundry.inputs.units import expand_units
from enginefoundry.lanes.reference import BUNDLE_MODEL_DIR, ReferenceLane
from enginefoundry.model_server import Endpoint, free_port, serving
from enginefoundry.spec import load_spec
from tests.support.paths import REPO, TINY_MODEL, TINY_PROMPTS

SPEC = load_spec(REPO / "configs" / "tiny-cpu.yaml")


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "EF_REFERENCE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", "smoke", *args], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("bundle")
    unit = expand_units(SPEC)[0]
    lane = ReferenceLane()
    ckpt = lane.convert(SPEC, unit.variant, TINY_MODEL, work)
    return Path(lane.build(SPEC, unit, Path(ckpt.checkpoint_dir), work).bundle_dir)


def _serve(bundle_dir: Path, log: Path) -> Iterator[Endpoint]:
    with serving(ReferenceLane().serve_command(bundle_dir, "127.0.0.1", free_port()), log) as endpoint:
        yield endpoint


def _args(ep: Endpoint, *extra: str) -> list[str]:
    return ["--endpoint", ep.base_url, "--served-model", ep.model_name, "--reference", str(TINY_MODEL),
            "--prompts", str(TINY_PROMPTS), "--max-new-tokens", "6", *extra]


def test_healthy_endpoint_passes_with_exit_0(bundle: Path, tmp_path: Path):
    for ep in _serve(bundle, tmp_path / "server.log"):
        done = _cli(*_args(ep, "--precision", "bf16", "--json", "--report-dir", str(tmp_path / "r")),
                    cache=tmp_path / "refs")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["verdict"]["passed"] and report["verdict"]["policy"]["family"] == "16-bit"
    # the default reference precision is the unit's own (like with like), as the spec's smoke.reference_precision
    assert report["verdict"]["reference"].startswith(f"bf16 reference {report['reference']['key'][:12]}")
    assert report["verdict"]["reference_why"] == "the unit's own precision bf16 (like with like)"
    assert report["reference"]["source"] == "computed" and (tmp_path / "r" / "smoke.md").is_file()
    assert (tmp_path / "refs" / f"{report['reference']['key']}.json").is_file()  # the next run reuses it


def test_wrong_chat_template_is_rejected_with_exit_1_naming_the_rule(bundle: Path, tmp_path: Path):
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    model = broken / BUNDLE_MODEL_DIR
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")
    for ep in _serve(broken, tmp_path / "server.log"):
        done = _cli(*_args(ep), cache=tmp_path / "refs")
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("REJECTED (judged against fp32 reference ")
    assert "tokenizer and chat template: prompt token count differs on 108/108 prompts" in last


def test_bad_input_exits_2_before_anything_runs(tmp_path: Path):
    missing = _cli("--endpoint", "http://127.0.0.1:9", "--served-model", "m", "--reference", str(tmp_path),
                   "--prompts", str(TINY_PROMPTS), cache=tmp_path)
    assert missing.returncode == 2 and "is not a Hugging Face model folder" in missing.stderr
    precision = _cli("--endpoint", "http://127.0.0.1:9", "--served-model", "m", "--reference", str(TINY_MODEL),
                     "--prompts", str(TINY_PROMPTS), "--precision", "fp64", cache=tmp_path)
    assert precision.returncode == 2 and "--precision 'fp64' is unknown" in precision.stderr
    nobody = _cli("--endpoint", f"http://127.0.0.1:{free_port()}", "--served-model", "m", "--reference",
                  str(TINY_MODEL), "--prompts", str(TINY_PROMPTS), "--max-new-tokens", "6", cache=tmp_path)
    assert nobody.returncode == 2 and "stopped answering at prompt 'add-0-0'" in nobody.stderr
    assert "Traceback" not in nobody.stderr


def test_missing_chat_template_is_reported_as_the_servers_failure_in_its_own_words(bundle: Path, tmp_path: Path):
    """Issue 24: on main this read "truncation: 0/108 prompts answered; refused … HTTP 500: Internal Server
    Error", the cause only in the server's log."""
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    model = broken / BUNDLE_MODEL_DIR
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    log = tmp_path / "server.log"
    for ep in _serve(broken, log):
        done = _cli(*_args(ep, "--server-log", str(log), "--json"), cache=tmp_path / "refs")
    assert done.returncode == 1, done.stderr[-2000:]
    rules = {r["name"]: r for r in json.loads(done.stdout)["verdict"]["rules"]}
    server = rules["server errors"]
    assert not server["ok"] and server["detail"].startswith("the server failed on 108/108 prompts (e.g. 'add-0-0': "
                                                            "HTTP 500")
    assert "the server's log says: ValueError: Cannot use chat template functions" in server["detail"]
    assert rules["truncation"]["ok"]
