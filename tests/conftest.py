"""Shared fixtures: the real services (SeaweedFS, MLflow and Prefect servers on PostgreSQL, loopback hub), started
once per session, and the cluster fixtures of tests/support/cluster.py (`prefect_server`, `cluster`).

CI (`.ci/run`) starts them with scripts/stack.py and exports their addresses; a developer who runs
`make test` without a stack gets one started here, in a temporary state dir, and stopped afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginefoundry.model_server import free_port
from tests.support.cluster import cluster_fixture, prefect_fixture  # noqa: F401  (session fixtures of the cluster)
from tests.support.paths import STACK_SCRIPT
from tests.support.private_stack import stack_down

NEEDED = ("EF_S3_ENDPOINT", "MLFLOW_TRACKING_URI", "HF_ENDPOINT", "EF_HUB_ROOT", "AWS_ACCESS_KEY_ID")
# The services CI started and exported (`source .stack/env`), as the `stack` fixture hands them out.
# Its EF_STORE (`.stack/env` exports the stack's store for the CLI) is left out: each test names its own store.
CI_STACK = ({k: v for k, v in os.environ.items() if k != "EF_STORE"} if all(os.environ.get(k) for k in NEEDED)
            else None)
# The destinations outrank a spec's (flag > env > spec, enginefoundry.settings): left in the environment, CI's
# exported MLflow server would replace every test spec's own sqlite database. Tests pass them explicitly.
for _destination in ("MLFLOW_TRACKING_URI", "EF_STORE"):
    os.environ.pop(_destination, None)

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # a busy host needs more than 20 s


TIERS = Path(__file__).resolve().parent
TIER_MARKS = {"integration": "services", "e2e": "e2e"}


# Fixtures that start a Prefect server and its workers (tests/support/cluster.py): under `pytest -n` (`make test`
# runs two pytest-xdist workers, `--dist loadgroup`), their tests go to one worker, so one session starts them once.
PREFECT_CLUSTER_FIXTURES = {"prefect_server", "cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of tests/integration is marked `services`, every test of tests/e2e `e2e` (pyproject.toml);
    every test that uses the session's Prefect server is grouped onto one xdist worker."""
    for item in items:
        path = Path(item.path).resolve()
        if path.is_relative_to(TIERS) and path.relative_to(TIERS).parts[0] in TIER_MARKS:
            item.add_marker(TIER_MARKS[path.relative_to(TIERS).parts[0]])
        if PREFECT_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("prefect-cluster"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Addresses and credentials of the running services, as environment variables.

    As in CI, a Prefect server is among them (no worker): the CLI runs of the tests talk to it instead of each
    starting a temporary API server of its own (20–60 s apiece on a busy host)."""
    if CI_STACK is not None:
        yield {**os.environ, **CI_STACK}
        return
    state = tmp_path_factory.mktemp("stack")
    # Free ports, so a developer's own stack on the default ports is left alone.
    env = {**os.environ, **{f"EF_{name}_PORT": str(free_port()) for name in ("S3", "MLFLOW", "PREFECT", "HUB")}}
    up = subprocess.run([sys.executable, str(STACK_SCRIPT), "up", "--state-dir", str(state),
                         "--services", "s3,mlflow,prefect,hub", "--worker-pools", "",
                         "--owner-pid", str(os.getpid())],  # a killed session leaves no service behind
                        env=env, capture_output=True, text=True)
    if up.returncode != 0:
        subprocess.run([sys.executable, str(STACK_SCRIPT), "down", "--state-dir", str(state)])
        pytest.fail(f"could not start the test services:\n{up.stdout}\n{up.stderr}")
    try:
        exported = json.loads((state / "env.json").read_text())
        exported.pop("EF_STORE", None)  # each test names its own store
        yield {**os.environ, **exported}
    finally:
        stack_down(state)  # detached: a second Ctrl-C cannot cut it halfway


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def s3(stack: dict[str, str]):  # boto3 client on the test SeaweedFS
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=stack["EF_S3_ENDPOINT"], region_name="us-east-1",
                        aws_access_key_id=stack["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=stack["AWS_SECRET_ACCESS_KEY"],
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def s3_env(stack: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point in-process boto3 clients at the test SeaweedFS."""
    for k in ("EF_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, stack[k])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return stack


FAKE_TRTLLM = Path(__file__).parent / "fixtures" / "fake-trtllm"


@pytest.fixture(scope="session")
def fake_trtllm():
    """The fake TensorRT-LLM toolchains 1.0/1.1/1.2 (tests/fixtures/fake-trtllm): its `fakehelp` module, with
    `RELEASES`, `release_dir(release)` and `expected_surface(release)`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fakehelp", FAKE_TRTLLM / "fakehelp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
