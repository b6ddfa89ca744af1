"""Fault table rows 18–19 (docs/reliability.md): the S3 server (a private SeaweedFS, started by
scripts/stack.py like `make stack` starts it) killed with SIGKILL in the middle of an upload and in the middle
of a download, then restarted on the same port and data folder.

What must hold, whatever the moment of the kill: no object in the store is other than its name says (every
blob's sha256 is its key), no pointer names a manifest that is not complete, the failed step ends with a
one-line error (no traceback) or completes through the restart, and the next attempt completes unaided with
a build that verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from enginefoundry.model_server import free_port
from tests.support.paths import REPO, STACK_SCRIPT

pytestmark = pytest.mark.services

FILES, FILE_MIB = 48, 4  # 192 MiB: long enough on loopback that the kill lands mid-transfer



@dataclass
class PrivateS3:
    state: Path
    env: dict[str, str]

    def _stack(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(STACK_SCRIPT), *args, "--state-dir", str(self.state)],
                              env=self.env, capture_output=True, text=True, timeout=300)

    def up(self) -> None:
        up = self._stack("up", "--services", "s3", "--worker-pools", "")
        assert up.returncode == 0, up.stdout + up.stderr

    def kill(self) -> None:
        """SIGKILL to SeaweedFS's whole process group: the server dies as in a crash, nothing is flushed. Returns
        once its port is released (SIGKILL is delivered, not awaited: a restart begun at once found the port still
        bound under load, and `stack up` refuses a busy port)."""
        pid = int((self.state / "pids" / "s3.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        port, deadline = int(self.env["EF_S3_PORT"]), time.monotonic() + 30
        while not _port_released(port):
            assert time.monotonic() < deadline, f"port {port} still bound 30 s after SIGKILL to SeaweedFS"
            time.sleep(0.05)

    def down(self) -> None:
        self._stack("down")

    def client_env(self) -> dict[str, str]:
        stack_env = json.loads((self.state / "env.json").read_text())
        return {**self.env, **{k: v for k, v in stack_env.items() if k.startswith("AWS_")},
                "AWS_ENDPOINT_URL_S3": stack_env["AWS_ENDPOINT_URL_S3"],
                # Few, quick retries: the restart, not botocore's patience, is what is tested.
                "EF_S3_MAX_ATTEMPTS": "2"}


@pytest.fixture
def private_s3(tmp_path: Path) -> Iterator[PrivateS3]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "EF_", "MLFLOW_", "PREFECT_"))}
    env |= {"EF_S3_PORT": str(free_port()), "EF_STACK_READY_TIMEOUT_S": "300", "PYTHONPATH": str(REPO)}
    s3 = PrivateS3(tmp_path / "stack", env)
    s3.up()
    try:
        yield s3
    finally:
        s3.down()


def _unit(folder: Path) -> Path:
    """FILES distinct files of FILE_MIB MiB (random: no two share a blob), plus a small config."""
    (folder / "model").mkdir(parents=True)
    for i in range(FILES):
        (folder / "model" / f"shard-{i:03d}.bin").write_bytes(os.urandom(FILE_MIB * 2**20))
    (folder / "model" / "config.json").write_text(f'{{"shards": {FILES}}}')
    return folder


def _python(env: dict[str, str], code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


# The publish step of a run, as tasks/publish.py calls it: blobs, manifest, pointer.
PUBLISH = """
import sys
from pathlib import Path
from enginefoundry.errors import EngineFoundryError
from enginefoundry.store.publish import publish_build
from enginefoundry.store.backends import open_store
from enginefoundry.inputs.units import key_of

def publish() -> int:
    comps = {"unit": "s3-restart"}
    fields = dict(key=key_of(comps), key_components=comps, model="m", unit="u", lane="reference", target={},
                  variant={}, profile={}, source={}, status="candidate", mlflow_run_id="r")
    result = publish_build(open_store(sys.argv[1]), "m", fields, {"bundle": Path(sys.argv[2])})
    print("published", result.uri, flush=True)
    return 0

try:
    sys.exit(publish())
except EngineFoundryError as err:  # as the CLI reports it: one line, exit 1
    print(f"error: {err}", flush=True)
    sys.exit(1)
"""


def _s3(env: dict[str, str]):
    import boto3

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _store_objects(env: dict[str, str]) -> dict[str, bytes]:
    s3 = _s3(env)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="enginefoundry", Prefix="store/")
    return {o["Key"]: s3.get_object(Bucket="enginefoundry", Key=o["Key"])["Body"].read()
            for page in pages for o in page.get("Contents", [])}


def _assert_store_consistent(env: dict[str, str]) -> int:
    """Every blob is what its name says; every pointer names a manifest whose blobs all exist with their
    sizes. Returns the number of pointers."""
    objects = _store_objects(env)
    for key, data in objects.items():
        if key.startswith("store/blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == key.rsplit("/", 1)[1], f"{key} holds other bytes"
    pointers = [k for k in objects if k.endswith("/current.json")]
    for pointer in pointers:
        build_id = json.loads(objects[pointer])["build_id"]
        manifest = json.loads(objects[f"{pointer.rsplit('/', 1)[0]}/{build_id}.json"])
        for entry in manifest["files"]:
            blob = objects.get(f"store/blobs/sha256/{entry['sha256'][:2]}/{entry['sha256']}")
            assert blob is not None and len(blob) == entry["size"], f"{pointer}: {entry['path']} missing or short"
    return len(pointers)


def _port_released(port: int) -> bool:
    """The check `stack up` makes (scripts/stacklib/net.py port_is_free): a bind with SO_REUSEADDR succeeds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kill_when(condition, proc: subprocess.Popen[str], s3: PrivateS3, what: str) -> None:
    deadline = time.monotonic() + 300
    while not condition():
        assert proc.poll() is None, f"the {what} ended before the kill:\n{proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"the {what} did not start within 300 s"
        time.sleep(0.02)
    assert proc.poll() is None, f"the {what} was over before the kill: make the payload larger"
    s3.kill()


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def _blob_count(env: dict[str, str]) -> int:
    try:
        return _s3(env).list_objects_v2(Bucket="enginefoundry", Prefix="store/blobs/").get("KeyCount", 0)
    except Exception:
        return 0


def test_s3_killed_and_restarted_mid_upload(private_s3: PrivateS3, tmp_path: Path) -> None:
    env = private_s3.client_env()
    unit = _unit(tmp_path / "unit")
    store = "s3://enginefoundry/store"
    proc = _python(env, PUBLISH, store, str(unit))
    _kill_when(lambda: _blob_count(env) >= 3, proc, private_s3, "upload")
    restart = threading.Thread(target=private_s3.up)
    restart.start()
    rc, out = _finish(proc)
    restart.join()
    if rc != 0:  # the publish outlived its retries: a one-line error naming the store, no traceback
        assert "Traceback" not in out, out[-3000:]
        assert store in out, out[-3000:]
    _assert_store_consistent(env)

    # The next attempt completes unaided: complete build, every file verified.
    rc, out = _finish(_python(env, PUBLISH, store, str(unit)))
    assert rc == 0, out[-3000:]
    assert _assert_store_consistent(env) == 1
    verify = subprocess.run([sys.executable, "-m", "enginefoundry.cli", "verify",
                             out.split("published ", 1)[1].split()[0]], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_s3_killed_and_restarted_mid_download(private_s3: PrivateS3, tmp_path: Path) -> None:
    env = private_s3.client_env()
    unit = _unit(tmp_path / "unit")
    rc, out = _finish(_python(env, PUBLISH, "s3://enginefoundry/store", str(unit)))
    assert rc == 0, out[-3000:]
    uri = out.split("published ", 1)[1].split()[0]
    dest = tmp_path / "pulled"

    def pull() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "enginefoundry.cli", "pull", uri, str(dest),
                                 "--workers", "2"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    proc = pull()
    _kill_when(lambda: dest.is_dir() and any(dest.rglob("shard-*")), proc, private_s3, "download")
    restart = threading.Thread(target=private_s3.up)
    restart.start()
    rc, out = _finish(proc)
    restart.join()
    # The pull retries each file through the restart (verify.PULL_ATTEMPTS); had it given up, one line, no
    # traceback.
    assert rc == 0 or "Traceback" not in out, out[-3000:]
    # Whatever the first pull left, a file under its own name is whole and verified: partial downloads live
    # only under hidden temporary names, never where a server would read them.
    shards = {p.name: p.read_bytes() for p in (dest / "bundle" / "model").glob("shard-*")} if dest.exists() else {}
    for name, data in shards.items():
        assert data == (unit / "model" / name).read_bytes(), f"{name} is partial or wrong"

    rc, out = _finish(pull())
    assert rc == 0, out[-3000:]
    for src in (unit / "model").iterdir():
        assert (dest / "bundle" / "model" / src.name).read_bytes() == src.read_bytes()
    assert not [p for p in dest.rglob("*") if p.name.endswith(".partial")], "a temporary file was left behind"
