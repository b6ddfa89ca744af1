"""A network error names the endpoint and the variable that sets it. Real clients (huggingface_hub, boto3,
MLflow) against a loopback port nothing listens on: the error a user would get, not a mock."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: connections are refused


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "enginefoundry.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", **env}, timeout=300)


def test_unreachable_hub_names_hf_endpoint(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = "hf://org/tiny@main"
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    url = f"http://127.0.0.1:{_closed_port()}"
    result = _cli("run", str(spec), "--store", f"file://{tmp_path}/store", env={"HF_ENDPOINT": url})
    assert result.returncode == 2, result.stderr
    assert url in result.stderr and "HF_ENDPOINT" in result.stderr and "Traceback" not in result.stderr


def test_unreachable_mlflow_names_mlflow_tracking_uri() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    result = _cli("promote", "m", "--target", "cpu", "--json",
                  env={"MLFLOW_TRACKING_URI": url, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    assert result.returncode == 1
    assert url in result.stderr and "MLFLOW_TRACKING_URI" in result.stderr
    assert '"exit_code": 1' in result.stdout  # --json: the failure as a document too


def test_unreachable_s3_names_aws_endpoint_url_s3(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    result = _cli("explain", str(REPO / "configs" / "tiny-cpu.yaml"), "--store", "s3://bucket/prefix",
                  env={"AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                       "AWS_MAX_ATTEMPTS": "1", "EF_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 1
    assert url in result.stderr and "AWS_ENDPOINT_URL_S3" in result.stderr and "Traceback" not in result.stderr
