"""Fixtures for cluster-mode tests: a Prefect server of their own, the deployments of deployment.yaml, and
process workers that inherit the test services' environment.

Their own server (scripts/stack.py in a temp state dir, on a free port, with its own PostgreSQL), even where
`.ci/run` exported PREFECT_API_URL: that stack's `cpu` worker would pick up our runs with another environment, and the
assertions about which worker ran which unit need workers we started. The S3/MLflow/hub services come from
the session `stack` fixture of conftest.py.

tests/conftest.py registers the fixtures `prefect_server` and `cluster` (one instance per session for all tiers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from enginefoundry.catalog.gpu_targets import pools
from enginefoundry.model_server import free_port
from tests.support.paths import REPO, STACK_SCRIPT, TINY_MODEL, TINY_PROMPTS
from tests.support.private_stack import stack_down

STACK = STACK_SCRIPT
PREFECT = str(Path(sys.executable).parent / "prefect")
# The second pool of the tests: a name no deployment.yaml pool uses, mapped to a second cpu target.
SECOND_POOL = "cpu-b"
GPU_POOL = "gpu-sm90"  # a worker here has no GPU: units sent to it must be refused
WORKER_POOLS = ("cpu", SECOND_POOL, GPU_POOL)
DEPLOYMENT_POOLS = tuple(pools())  # every row of enginefoundry/catalog/gpu_targets.py
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def prefect_http(api: str) -> httpx.Client:
    """A client of a test Prefect server's REST API. It sends nothing again: the server keeps its state in the
    stack's PostgreSQL (scripts/stacklib/postgres.py), where concurrent writes get no 503. On SQLite they did
    ("database is locked", SQLITE_BUSY_SNAPSHOT: docs/facts/infra.md §3.7), and this client retried them until
    issue 40; tests/integration/test_prefect_busy.py holds the server to none."""
    return httpx.Client(base_url=api, timeout=30, trust_env=False)


@dataclass
class PrefectServer:
    state: Path
    env: dict[str, str]  # the test services + this server's PREFECT_* settings
    api: str
    ui: str
    workers: dict[str, str] = field(default_factory=dict)  # pool → worker name

    def client(self) -> httpx.Client:
        return prefect_http(self.api)

    def prefect(self, *args: str, timeout: int = 180) -> subprocess.CompletedProcess[str]:
        """The prefect CLI against this server, from the project folder."""
        return subprocess.run([PREFECT, "--no-prompt", *args], cwd=REPO, env={**self.env, "PROJECT_DIR": str(REPO)},
                              capture_output=True,
                              text=True, timeout=timeout)

    def stack(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(STACK), *args, "--state-dir", str(self.state)],
                              env=env or self.env, capture_output=True, text=True, timeout=240)

    def run_deployment(self, name: str, parameters: dict[str, Any]) -> str:
        flow_name, deployment = name.split("/", 1)
        with self.client() as http:
            dep = http.get(f"/deployments/name/{flow_name}/{deployment}")
            dep.raise_for_status()
            run = http.post(f"/deployments/{dep.json()['id']}/create_flow_run", json={"parameters": parameters})
            run.raise_for_status()
            return run.json()["id"]

    def wait(self, flow_run_id: str, timeout_s: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self.client() as http:
            while True:
                run = http.get(f"/flow_runs/{flow_run_id}").json()
                if run["state_type"] in FINAL:
                    return run
                if time.monotonic() > deadline:
                    raise AssertionError(f"flow run {flow_run_id} still {run['state_type']} after {timeout_s} s")
                time.sleep(1)

    def task_runs(self, flow_run_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
        """The flow run's task runs once the server has recorded them.

        Prefect 3 records task runs from events, after the flow run's own state: a query made
        the moment the flow run ends may find none yet. Waits until at least one is recorded
        and every one has a final state."""
        deadline = time.monotonic() + timeout_s
        with self.client() as http:
            while True:
                found = http.post("/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run_id]}}})
                found.raise_for_status()
                tasks = found.json()
                if tasks and all(t["state_type"] in FINAL for t in tasks):
                    return tasks
                if time.monotonic() > deadline:
                    return tasks
                time.sleep(0.5)

    def children(self, parent_id: str) -> list[dict[str, Any]]:
        with self.client() as http:
            found = http.post("/flow_runs/filter", json={"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}})
            found.raise_for_status()
            return found.json()

    def artifacts(self, flow_run_id: str) -> dict[str, dict[str, Any]]:
        with self.client() as http:
            found = http.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
            found.raise_for_status()
            return {a["key"]: a for a in found.json()}


@pytest.fixture(scope="session", name="prefect_server")
def prefect_fixture(stack: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A Prefect server with UI on a free port; the environment the tests and workers use."""
    state = tmp_path_factory.mktemp("prefect-stack")
    port = free_port()
    base = {**stack, "EF_PREFECT_PORT": str(port), "PREFECT_LOGGING_LEVEL": "WARNING",
            "EF_WORK_DIR": str(state / "work"), "EF_CACHE_DIR": str(state / "cache"), "HF_HOME": str(state / "hf"),
            "HF_HUB_DISABLE_XET": "1", "OMP_NUM_THREADS": "1", "PREFECT_WORKER_QUERY_SECONDS": "2"}
    base.pop("PREFECT_API_URL", None)
    server = PrefectServer(state=state, env=base, api=f"http://127.0.0.1:{port}/api", ui=f"http://127.0.0.1:{port}")
    up = server.stack("up", "--services", "prefect", "--worker-pools", "", "--owner-pid", str(os.getpid()))
    if up.returncode != 0:
        server.stack("down")
        pytest.fail(f"could not start the Prefect server:\n{up.stdout}\n{up.stderr}")
    server.env = {**base, **json.loads((state / "env.json").read_text()), "PREFECT_HOME": str(state / "prefect")}
    try:
        yield server
    finally:
        stack_down(state, server.env)  # detached: a second Ctrl-C cannot cut it halfway


@pytest.fixture(scope="session", name="cluster")
def cluster_fixture(prefect_server: PrefectServer) -> PrefectServer:
    """deployment.yaml deployed as is, one more unit deployment for the second pool, and a process worker on
    each of cpu, cpu-b and gpu-sm90 (stopped with the server, workers first)."""
    server = prefect_server
    if server.workers:
        return server
    # `prefect deploy --no-prompt` refuses a deployment whose work pool does not exist: pools first.
    create_process_pools(server, [*DEPLOYMENT_POOLS, SECOND_POOL])
    deploy = server.prefect("deploy", "--prefect-file", "deployment.yaml", "--all")
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    extra = server.state / "second-pool.yaml"
    extra.write_text(yaml.safe_dump(second_pool_deployment(REPO / "deployment.yaml"), sort_keys=False))
    deploy = server.prefect("deploy", "--prefect-file", str(extra), "--all")
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    up = server.stack("up", "--services", "", "--worker-pools", ",".join(WORKER_POOLS))
    assert up.returncode == 0, up.stdout + up.stderr
    with server.client() as http:
        for pool in WORKER_POOLS:
            workers = http.post(f"/work_pools/{pool}/workers/filter", json={}).json()
            server.workers[pool] = next(w["name"] for w in workers if w["name"].startswith(f"ef-{pool}-"))
    return server


def create_process_pools(server: PrefectServer, pools: list[str]) -> None:
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    with server.client() as http:
        for pool in pools:
            made = http.post("/work_pools/", json={"name": pool, "type": "process", "base_job_template": template})
            assert made.status_code in (201, 409), made.text


def second_pool_deployment(deployment_yaml: Path) -> dict[str, Any]:
    """A copy of deployment.yaml's `build-unit/cpu` deployment for the second pool."""
    data = yaml.safe_load(deployment_yaml.read_text())
    unit = next(d for d in data["deployments"] if d["entrypoint"].endswith(":build_unit") and d["name"] == "cpu")
    data["deployments"] = [{**unit, "name": SECOND_POOL, "tags": ["enginefoundry", "unit", SECOND_POOL],
                            "work_pool": {"name": SECOND_POOL, "work_queue_name": "default"}}]
    data.pop("definitions", None)
    return data


def seed_unique_model(hub_root: Path, repo_id: str, tmp: Path, note: str) -> str:
    """Commit the tiny model plus a model card naming `note` to the loopback hub; returns the commit sha.

    The card changes the weights digest, so every test gets unit keys of its own: the MLflow server and store
    are shared with other tests, and `lineage <key>` must not find this test's units under their keys.
    """
    from tests.services.hub_server import seed_repo

    folder = tmp / f"model-{note}"
    shutil.copytree(TINY_MODEL, folder)
    (folder / "README.md").write_text(f"# tiny chat\n\n{note}\n")
    return seed_repo(hub_root, repo_id, folder)


def write_spec(tmp: Path, *, source: str, store: str, mlflow_uri: str, experiment: str,
               targets: list[dict[str, Any]] | None = None, registered_model: str | None = None,
               benchmark: bool = True, adapters: dict[str, Path] | None = None) -> Path:
    """The tiny spec, cut down for tests (as in test_pipeline_e2e.py), against the test services. `benchmark=False`
    turns its one-point benchmark off for tests about something else (each point is a fresh AIPerf: ~15 s of CPU).
    `adapters`: model.adapters by name → folder, merged into the base (adapter_mode merge: one unit per adapter)."""
    spec = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    spec["model"]["source"] = source
    spec["smoke"]["prompts"] = str(TINY_PROMPTS)
    spec["benchmark"].update({"enabled": benchmark, "concurrency": [2], "request_count": 8, "warmup_request_count": 1})
    spec["publish"] = {"store": store}
    spec["tracking"] = {"mlflow_uri": mlflow_uri, "experiment": experiment}
    if registered_model:
        spec["tracking"]["registered_model"] = registered_model
    if targets is not None:
        spec["targets"] = targets
    if adapters:
        spec["model"]["adapters"] = [{"name": name, "source": str(folder)} for name, folder in adapters.items()]
        spec["model"]["adapter_mode"] = "merge"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"spec-{experiment}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
