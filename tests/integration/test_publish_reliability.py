"""The S3 server dies in the middle of an upload: the publish fails cleanly, no manifest exists, and the
next attempt publishes once. Uses a private SeaweedFS so killing it leaves the shared one alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from enginefoundry.errors import StoreError
from enginefoundry.inputs.units import key_of
from enginefoundry.model_server import free_port
from enginefoundry.store.backends import S3Store
from enginefoundry.store.publish import find_current, pointer_key, publish_build
from tests.support.paths import REPO

STACK = [sys.executable, str(REPO / "scripts" / "stack.py")]


def _up(state: Path, env: dict[str, str]) -> dict[str, str]:
    subprocess.run([*STACK, "up", "--state-dir", str(state), "--services", "s3"], env=env, check=True,
                   capture_output=True)
    return json.loads((state / "env.json").read_text())


def test_s3_killed_mid_upload_leaves_no_manifest_and_the_retry_publishes_once(tmp_path, monkeypatch):
    state = tmp_path / "s3state"
    env = {**os.environ, "EF_S3_PORT": str(free_port())}
    s3env = _up(state, env)
    try:
        for k in ("EF_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(k, s3env[k])
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # fail fast once the server is gone
        folder = tmp_path / "bundle"
        folder.mkdir()
        with (folder / "weights.bin").open("wb") as f:
            for _ in range(24):
                f.write(os.urandom(16 * 1024 * 1024))  # 384 MiB: many multipart parts
        store = S3Store("s3://enginefoundry/reliability")
        errors: list[BaseException] = []
        fields = dict(key=key_of({}), key_components={}, model="m", unit="u", lane="reference", target={},
                      variant={}, profile={}, source={}, status="candidate")

        def publish() -> None:
            try:
                publish_build(store, "m", fields, {"bundle": folder}, progress=lambda _: None)
            except BaseException as err:
                errors.append(err)

        worker = threading.Thread(target=publish)
        worker.start()
        _wait_for_uploaded_parts(s3env, "enginefoundry", worker)  # the upload is under way: kill S3 now
        subprocess.run([*STACK, "down", "--state-dir", str(state)], check=True, capture_output=True)
        worker.join(timeout=180)
        assert not worker.is_alive()
        assert errors and isinstance(errors[0], StoreError), errors

        _up(state, env)  # same data dir: what was stored before the crash is still there
        store = S3Store("s3://enginefoundry/reliability")
        assert not store.exists(pointer_key("m", key_of({})))
        result = publish_build(store, "m", fields, {"bundle": folder}, progress=lambda _: None)
        assert result.created
        current = find_current(store, "m", key_of({}))
        assert current is not None and current.build_id == result.build_id
        manifests = [k for k in store.list(f"manifests/m/{key_of({})}/") if not k.endswith("current.json")]
        assert manifests == [current.manifest_key]
    finally:
        subprocess.run([*STACK, "down", "--state-dir", str(state)], capture_output=True)


def _wait_for_uploaded_parts(s3env: dict[str, str], bucket: str, worker: threading.Thread) -> None:
    """Poll (deadline 120 s) until a multipart upload to `bucket` has at least one part stored."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=s3env["EF_S3_ENDPOINT"], region_name="us-east-1",
                      aws_access_key_id=s3env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=s3env["AWS_SECRET_ACCESS_KEY"],
                      config=Config(s3={"addressing_style": "path"}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert worker.is_alive(), "the upload finished before S3 could be killed"
        for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            if s3.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts"):
                return
        time.sleep(0.05)
    raise AssertionError("no multipart part was stored within 120 s")


@pytest.fixture(autouse=True)
def _no_leftover_weed(tmp_path):
    yield
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert not out.stdout.strip(), "a SeaweedFS process outlived the test"
