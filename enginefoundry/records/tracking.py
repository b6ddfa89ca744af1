"""MLflow tracking: one parent run per pipeline run, one child run per unit (docs/architecture.md#mlflow-schema).

Uses MlflowClient with explicit run ids (no fluent "active run"), because units run in threads, always through
the one client wrapper `RetryingClient` (`mlflow_client`): every MLflow call of the project is retried there and
nowhere else (see `RetryingClient` for the bound). Everything logged passes through `redact`, so no credential
reaches a param, tag or artifact.

No run stays RUNNING: every run this process opens is remembered until it ends; at interpreter exit the
ones still open end FAILED, or KILLED after Ctrl-C or SIGTERM. Runs of a process that was `kill -9`-ed are
ended KILLED by the next run on the same host (`end_dead_runs`: their pid is gone). LoggedModels end READY
when their version is registered, FAILED otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefoundry import tracking_tags as mltags
from enginefoundry.errors import PipelineError
from enginefoundry.locks import host_lock
from enginefoundry.records import db_templates
from enginefoundry.retry import retry_transient
from enginefoundry.runner import cancel_reason, install_signal_policy, interrupted
from enginefoundry.schemas.loose import MlflowPayload

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

HOST_TAG, PID_TAG, START_TAG = mltags.OWNER_HOST, mltags.OWNER_PID, mltags.OWNER_PID_START

_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
               "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redact(value: Any) -> str:
    text = str(value)
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    for name in _SECRET_ENV:
        secret = os.environ.get(name)
        if secret and len(secret) >= 6:
            text = text.replace(secret, "***")
    return text


def flatten(prefix: str, data: MlflowPayload) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(name, v))
        else:
            out[name] = redact(v)[:6000]
    return out


def project_git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _process_start(pid: int) -> str:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it names one
    process even after its pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


# The one retry layer of MLflow calls: attempts per call, and the backoff between them (full jitter: sleeps of
# at most 1, 2, 4, 8, 16 s, 31 s in all).
MLFLOW_ATTEMPTS = 6
MLFLOW_BACKOFF_BASE_S = 1.0
MLFLOW_BACKOFF_CAP_S = 16.0


class RetryingClient:
    """The project's one MLflow client wrapper: an `MlflowClient` whose every method call is retried on transient
    errors (`retry.retry_transient`: connection failures, timeouts, HTTP 429/5xx, a locked SQLite file) and on
    nothing else. This is the only layer that retries an MLflow call: the Prefect tasks that record to MLflow
    carry no task retries, and MLflow's own HTTP retries are off (`mlflow_client` sets
    MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 unless the environment sets it: mlflow/environment_variables.py@3.17.2,
    read per request by mlflow/utils/rest_utils.py, default 7 retries with backoff factor 2).

    Bound: one MLflow call makes at most MLFLOW_ATTEMPTS (6) HTTP attempts, each within MLflow's request timeout
    (MLFLOW_HTTP_REQUEST_TIMEOUT, default 120 s), with at most 31 s of backoff between them; an environment that
    sets MLFLOW_HTTP_REQUEST_MAX_RETRIES=n multiplies the attempts by n + 1. (Before issue 20 three layers
    multiplied: 4 task runs × 4 wrapper attempts × 8 HTTP attempts = 128 for one call.)

    `raw` is the unwrapped client, for a caller that must ask once (the end of open runs at exit)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def __getattr__(self, name: str) -> Any:
        if name == "raw":  # not set yet (a copy being built): never look it up through itself
            raise AttributeError(name)
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return retry_transient(lambda: attr(*args, **kwargs), what=f"MLflow {name}", attempts=MLFLOW_ATTEMPTS,
                                   base_s=MLFLOW_BACKOFF_BASE_S, cap_s=MLFLOW_BACKOFF_CAP_S)

        return call


def mlflow_client(tracking_uri: str, registry_uri: str | None = None) -> RetryingClient:
    """The MLflow client of every caller (tracking, registration, promotion, lineage): `RetryingClient`."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # retried once, in RetryingClient
    return RetryingClient(MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri))


class _OpenRuns:
    """The runs this process started and has not ended, with the client that can end them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RetryingClient | MlflowClient] = {}  # run id → the client that ends it
        self.interrupted = False  # a signal arrived (runner.interrupted, read when the runs end)
        atexit.register(self._end_all_at_exit)

    def add(self, run_id: str, client: RetryingClient | MlflowClient) -> None:
        with self._lock:
            self._runs[run_id] = client
        install_signal_policy()  # SIGINT/SIGTERM are remembered, so the runs end KILLED, not FAILED

    def discard(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def end_all(self, status: str | None = None, once: bool = False) -> list[str]:
        """End every open run: `status`, else KILLED after a signal, else FAILED (an exit without end_run).
        `once`: one request per call, no retry (at exit)."""
        self.interrupted = self.interrupted or interrupted()
        status = status or ("KILLED" if self.interrupted else "FAILED")
        with self._lock:
            runs, self._runs = self._runs, {}
        for run_id, wrapped in runs.items():
            client = wrapped.raw if once and isinstance(wrapped, RetryingClient) else wrapped
            try:
                client.set_tag(run_id, mltags.END_REASON, "interrupted" if self.interrupted else "error")
                client.set_terminated(run_id, status=status)
            except Exception:  # at exit, an unreachable server must not hide the real error
                pass
        return list(runs)

    def _end_all_at_exit(self) -> None:
        """At exit, end what is still open asking the MLflow server once (no retries, a 10 s timeout) instead of
        MLflow's default 7 retries with backoff factor 2, minutes against a server that is down
        (MLFLOW_HTTP_REQUEST_MAX_RETRIES, _TIMEOUT: mlflow/environment_variables.py@3.17.2, read per request by
        mlflow/utils/rest_utils.py). A run left open is ended KILLED by the next run on this host
        (`end_dead_runs`)."""
        with self._lock:
            if not self._runs:
                return
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # the process is exiting: nothing else reads it
        if float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")) > 10:
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "10"
        self.end_all(once=True)


OPEN_RUNS = _OpenRuns()


def end_open_runs_cancelled(reason: str) -> list[str]:
    """A cancelled run: every run this process opened, and every still-RUNNING run under them (a unit that ran on
    another worker, which may never come back to end it), ends KILLED now, tagged with the reason."""
    with OPEN_RUNS._lock:
        runs = dict(OPEN_RUNS._runs)
    ended = []
    for run_id, client in runs.items():
        with contextlib.suppress(Exception):  # a server away: the runs are ended at exit, or by the next rollout
            experiment = client.get_run(run_id).info.experiment_id
            children = client.search_runs([experiment], filter_string=f"tags.`{mltags.MLFLOW_PARENT_RUN_ID}` = "
                                                                      f"'{run_id}' and attributes.status = 'RUNNING'")
            for child in children:
                client.set_tag(child.info.run_id, mltags.END_REASON, f"cancelled: {reason}"[:500])
                client.set_terminated(child.info.run_id, status="KILLED")
                ended.append(child.info.run_id)
    for run_id, client in runs.items():
        with contextlib.suppress(Exception):
            client.set_tag(run_id, mltags.END_REASON, f"cancelled: {reason}"[:500])
            client.set_terminated(run_id, status="KILLED")
            ended.append(run_id)
        OPEN_RUNS.discard(run_id)
    return ended


def end_orphaned_runs(client: Any, experiment_ids: list[str], finished: Any) -> list[str]:
    """Runs still RUNNING whose Prefect flow run is over (`finished(flow_run_id)` → its final state's name, None
    while it runs or when unknown) end KILLED: a unit whose worker crashed or was cancelled and never came back
    ends its own run never. The next rollout calls it, on whichever host it runs."""
    ended = []
    runs = client.search_runs(experiment_ids, filter_string="attributes.status = 'RUNNING'", max_results=1000)
    for run in runs:
        flow_run = run.data.tags.get(mltags.PREFECT_FLOW_RUN_ID)
        state = finished(flow_run) if flow_run else None
        if state is None:
            continue
        client.set_tag(run.info.run_id, mltags.END_REASON, f"its Prefect flow run ended {state}")
        client.set_terminated(run.info.run_id, status="KILLED")
        ended.append(run.info.run_id)
    return ended


def end_open_runs(status: str | None = None) -> list[str]:
    """End the runs this process left open (flows call it when they fail; atexit calls it anyway)."""
    return OPEN_RUNS.end_all(status)


# MLflow adds a Default experiment with the file's own artifact root when it opens a file that has none
# (`SqlAlchemyStore._initialize_store_state`, mlflow/store/tracking/sqlalchemy_store.py@3.17.2): the template
# keeps none, so each new file gets its own.
_MLFLOW_PER_FILE_ROWS = ("DELETE FROM experiment_tags", "DELETE FROM experiments")


def _started_from_mlflow_template(db: Path | None) -> contextlib.AbstractContextManager[object]:
    if db is None:
        return contextlib.nullcontext()
    import mlflow

    return db_templates.started_from_template(db, "mlflow", mlflow.__version__, _MLFLOW_PER_FILE_ROWS,
                                              _mlflow_template_rules())


def _mlflow_template_rules() -> db_templates.TemplateRules:
    """A migrated MLflow file's own rows (its Alembic head, the default workspace: migration
    1b5f0d9ad7c1_add_workspace_columns_and_catalog, mlflow/store/db_migrations/versions@3.17.2) and its whole schema
    as this MLflow release's migrations make it (enginefoundry/schemas/recorded-db/mlflow-<release>.json)."""
    import mlflow

    return db_templates.recorded_rules("mlflow", mlflow.__version__, rows={"alembic_version": 1, "workspaces": 1},
                                       label="MLflow")


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self.uri = tracking_uri
        db = Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Runs started together on one new SQLite file would each create its schema (alembic then fails:
            # "expected to match one row … in 'alembic_version'"): the first to open it does, the others wait.
            # MlflowClient opens its tracking store (and migrates the file) in its constructor.
            with host_lock(db.with_name(db.name + ".init-lock")) if db is not None else contextlib.nullcontext():
                # A new file starts as this MLflow release's migrated empty database (≈ 1.5 s of migrations
                # spared per new file, measured: enginefoundry/records/db_templates.py).
                with _started_from_mlflow_template(db):
                    self.client = mlflow_client(tracking_uri)
                self.experiment_id = self._experiment_id(experiment, db)
                if db is not None:  # the model registry opens (and would migrate) the file through its own store
                    self.client.search_registered_models(max_results=1)
        except Exception as err:
            raise PipelineError(
                f"tracking: cannot use MLflow at {redact(tracking_uri)} ({type(err).__name__}); start the server "
                "or point MLFLOW_TRACKING_URI (or --mlflow-uri, tracking.mlflow_uri) at a reachable one"
            ) from None

    def _experiment_id(self, experiment: str, db: Path | None) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(experiment)
        if exp is not None:
            return str(exp.experiment_id)
        # Keep local artifacts beside the database, not in ./mlruns of whatever cwd.
        artifact_location = (db.parent.resolve() / "mlartifacts").as_uri() if db is not None else None
        try:
            return str(self.client.create_experiment(experiment, artifact_location=artifact_location))
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                raise
            return str(exp.experiment_id)  # another run created it between our read and our create

    def start_run(self, name: str, tags: MlflowPayload, parent_id: str | None = None) -> str:
        all_tags = {k: redact(v) for k, v in tags.items()}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        pid = os.getpid()
        all_tags.update({HOST_TAG: socket.gethostname(), PID_TAG: str(pid), START_TAG: _process_start(pid)})
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        run_id = str(run.info.run_id)
        OPEN_RUNS.add(run_id, self.client)
        return run_id

    def end_dead_runs(self) -> list[str]:
        """Runs left RUNNING by a process of this host that is gone (kill -9, power loss) end KILLED."""
        host = socket.gethostname()
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'",
            max_results=1000)
        ended = []
        for run in runs:
            pid, start = run.data.tags.get(PID_TAG, ""), run.data.tags.get(START_TAG, "")
            if not pid.isdigit() or (_process_start(int(pid)) == start and start):
                continue  # still alive (same pid, same start time)
            self.client.set_tag(run.info.run_id, mltags.END_REASON, "process gone")
            self.client.set_terminated(run.info.run_id, status="KILLED")
            ended.append(run.info.run_id)
        return ended

    def log_params(self, run_id: str, params: MlflowPayload) -> None:
        from mlflow.entities import Param

        flat = flatten("", params)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, run_id: str, tags: MlflowPayload) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, redact(v))

    def log_metrics(self, run_id: str, metrics: dict[str, float | int | bool], step: int = 0) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def end_run(self, run_id: str, ok: bool) -> None:
        """FINISHED or FAILED; KILLED once the run was cancelled (a run ended KILLED by the cancel stays so)."""
        if cancel_reason():
            if self.client.get_run(run_id).info.status == "RUNNING":
                self.client.set_terminated(run_id, status="KILLED")
        else:
            self.client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")
        OPEN_RUNS.discard(run_id)


def ensure_registered_model(client: Any, name: str) -> None:
    """The registered model exists afterwards. Units of one run register at the same time (cluster mode: one
    worker each), so another unit may create it between our lookup and our create: MLflow then answers
    RESOURCE_ALREADY_EXISTS (mlflow/store/model_registry/sqlalchemy_store.py@3.17.2, create_registered_model),
    which is the state we wanted. Any other error (the server unreachable, refused credentials) is raised."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    try:
        client.create_registered_model(name, description="enginefoundry serving artifacts, one version per unit")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


@dataclass(frozen=True)
class UnitVersion:
    """A published unit as a version of a registered model: the unit's name, the MLflow run that built it, where
    its files lie in the store (the version's source without a tracking server), the version's tags, the unit's
    build parameters (its LoggedModel's) and the version's description (None: the unit and its manifest URI)."""

    unit_name: str
    run_id: str
    artifact_uri: str
    tags: dict[str, str]
    params: MlflowPayload
    description: str | None = None


def register_unit(tracker: Tracker, unit: UnitVersion, *, registered_model: str, alias: str | None) -> str:
    """An external MLflow model pointing at the store (weights never travel through MLflow), a version of
    the registered model, and the alias moved to it. Returns the version number."""
    client = tracker.client
    ensure_registered_model(client, registered_model)
    run_id, tags = unit.run_id, unit.tags
    clean_tags = {k: redact(v) for k, v in tags.items()}
    # LoggedModel names may not contain dots; unit names do (variant.profile.target).
    logged = client.create_logged_model(tracker.experiment_id, name=unit.unit_name.replace(".", "-"),
                                        source_run_id=run_id, tags=clean_tags, params=flatten("", unit.params),
                                        model_type="enginefoundry-unit")
    # On a tracking server every version is registered through its LoggedModel (`models:/<model_id>`, MLflow 3's
    # own form), the store location staying in the version's manifest_uri tag: the server refuses a local path as
    # a source unless it lies inside the run's or the model's artifact folder (mlflow/server/handlers.py@3.17.2,
    # _validate_source_run/_validate_source_model), and MLflow's UI links a version to its logged model only
    # from such a source (the bundled ModelVersionView's "Source Model": `source.match(/^models:\/([^/@]+)$/)`,
    # mlflow 3.17.2), since the SQL registry does not keep the `model_id` a version is created with
    # (mlflow/store/model_registry/sqlalchemy_store.py@3.17.2 create_model_version has no column for it).
    # Without a server (a database URI) the registry resolves `models:/` through the global tracking URI, not
    # this client's: there the store location is the source itself.
    on_server = tracker.uri.startswith(("http://", "https://", "databricks"))
    source = f"models:/{logged.model_id}" if on_server else unit.artifact_uri
    # A LoggedModel starts PENDING; it ends READY once its version exists, FAILED if registering fails.
    try:
        version = client.create_model_version(registered_model, source=source, run_id=run_id,
                                              tags=clean_tags, model_id=logged.model_id,
                                              description=unit.description
                                              or f"{unit.unit_name}: {tags.get('enginefoundry.manifest_uri', '')}")
        if alias:
            client.set_registered_model_alias(registered_model, alias, version.version)
    except BaseException:
        finalize_logged_model(client, logged.model_id, ok=False)
        raise
    finalize_logged_model(client, logged.model_id, ok=True)
    link_run_output(client, run_id, logged.model_id)
    return str(version.version)


def link_run_output(client: Any, run_id: str, model_id: str) -> None:
    """The LoggedModel as the run's output, so the run page lists it under "Logged models" (what
    `mlflow.<flavor>.log_model` records inside a run: MlflowClient.log_outputs, mlflow 3.17.2)."""
    from mlflow.entities import LoggedModelOutput

    client.log_outputs(run_id, [LoggedModelOutput(model_id=model_id, step=0)])


def finalize_logged_model(client: Any, model_id: str, *, ok: bool) -> None:
    """READY or FAILED; best effort on failure, so the registration error itself is what the user sees."""
    from mlflow.entities import LoggedModelStatus

    status = LoggedModelStatus.READY if ok else LoggedModelStatus.FAILED
    if ok:
        client.finalize_logged_model(model_id, status)
        return
    with contextlib.suppress(Exception):  # the server may be the reason registration failed: ask once
        getattr(client, "raw", client).finalize_logged_model(model_id, status)
