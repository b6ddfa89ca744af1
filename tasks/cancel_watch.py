"""Cancel means stop (issue 33 §3): a flow run of ours that is cancelled, or whose parent is, stops at once.

Prefect's UI Cancel dialog leaves "Cancel all sub flow runs" unticked: the API then only moves the parent's flow
run to Cancelling. Its worker kills the parent's process, but a unit on another worker (`run_deployment`) is
cancelled only once the server's cancellation-cleanup service sees the parent Cancelled (a loop, every 20 s by
default: prefect/server/services/cancellation_cleanup.py@3.9.1 `cancel_subflow_run`), and a run started by the
CLI (no worker, no runner) is killed by nobody. Meanwhile a unit could publish, register and move an alias.

So every flow of ours watches: a daemon thread reads its own flow run and its ancestors (parent task run → its
flow run, up the chain) every EF_CANCEL_POLL_S (2 s). At the first Cancelling or Cancelled among them it:

  1. marks the process as terminating (enginefoundry.runner.request_cancel): every checkpoint before a publish,
     a registration or an alias move raises from then on (`exit_if_terminating`);
  2. stops this process's model servers (the running smoke or benchmark fails fast);
  3. moves the unit runs it dispatched to Cancelling (their workers kill them; their own watchers stop them
     before that);
  4. ends at once, KILLED, the MLflow runs this process opened and the still-RUNNING unit runs under them (a
     unit on a worker that is gone never ends its own);
  5. moves its own flow run to Cancelling when only an ancestor was cancelled (its worker then kills it), and,
     when no runner supervises this process (the CLI's embedded run), interrupts the main thread (SIGTERM to
     itself: `finally` blocks run) and ends its flow run Cancelled at exit.

`cancelled_now()` is the synchronous check the publish and register stages make right before they write: a cancel
that the watcher has not polled yet still stops them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from importlib import metadata
from typing import Any
from uuid import UUID

from enginefoundry.settings import EnvSettings

CANCEL_STATES = ("CANCELLING", "CANCELLED")
# A private name of Prefect this module uses, on the release it was read and measured on (as
# orchestration/_prefect_private.py keeps the others; tests/unit/test_cancel_watch.py fails when it disappears
# from the installed Prefect).
MEASURED_PREFECT = ("3.9.1",)
CANCEL_INTENT = ("prefect._internal.control_listener", "_set_intent")
ANSWER_WAIT_S = 3.0  # how long a SIGTERM waits for the watcher to tell a cancel from another end
CLEANUP_WAIT_S = 20.0  # how long the exit waits for the cleanup of a cancel (MLflow runs ended, children cancelled)
_CHILDREN: set[UUID] = set()  # unit flow runs this process dispatched (flows/dispatch.py)
_LOCK = threading.Lock()


def track_child(flow_run_id: UUID) -> None:
    with _LOCK:
        _CHILDREN.add(flow_run_id)


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _chain(client: Any, flow_run_id: UUID) -> list[Any]:
    """The flow run and its ancestors (a subflow's parent task run belongs to the parent flow run)."""
    runs: list[Any] = []
    seen: set[UUID] = set()
    current: UUID | None = flow_run_id
    while current is not None and current not in seen and len(runs) < 8:
        seen.add(current)
        run = client.read_flow_run(current)
        runs.append(run)
        current = None
        if run.parent_task_run_id is not None:
            current = client.read_task_run(run.parent_task_run_id).flow_run_id
    return runs


def cancelled_in(runs: list[Any]) -> Any | None:
    """The first run of the chain that is Cancelling or Cancelled."""
    for run in runs:
        if run.state is not None and run.state.type.value in CANCEL_STATES:
            return run
    return None


def current_flow_run_id() -> UUID | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx.flow_run.id if ctx is not None and ctx.flow_run is not None else None


def cancelled_now() -> str | None:
    """Why this flow run must stop now (it or an ancestor is cancelled), asked of the API right now; None when
    not, or when no flow run or API is there to ask (the watcher and SIGTERM still stop it)."""
    from enginefoundry.runner import cancel_reason

    if reason := cancel_reason():
        return reason
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return None
    try:
        with _client() as client:
            found = cancelled_in(_chain(client, flow_run_id))
    except Exception:  # an API that does not answer now: the watcher keeps asking
        return None
    return None if found is None else f"flow run {found.name} is {found.state.name}"


def stop_if_cancelled(what: str) -> None:
    """Raise SystemExit(143) (as a SIGTERM would) when the run is cancelled, before `what` is done."""
    from enginefoundry.runner import exit_if_terminating, request_cancel
    from enginefoundry.tasks._log import progress_logger

    reason = cancelled_now()
    if reason:
        request_cancel(reason)
        progress_logger("error")(f"cancelled ({reason}): {what} not done")
    exit_if_terminating()


class _Watch:
    def __init__(self, flow_run_id: UUID, supervised: bool) -> None:
        self.flow_run_id, self.supervised = flow_run_id, supervised
        self.done = threading.Event()
        self.asked = threading.Event()  # a SIGTERM arrived: look now
        self.answered = threading.Event()  # ... and it was looked at (a cancel's intent is marked by then)
        self.cleaned = threading.Event()  # fire() finished its work
        self.fired = False
        self.thread = threading.Thread(target=self._run, name="ef-cancel-watch", daemon=True)

    def _run(self) -> None:
        interval = EnvSettings.read().cancel_poll_s
        while not self.done.is_set():
            self.asked.wait(interval)
            try:
                with _client() as client:
                    found = cancelled_in(_chain(client, self.flow_run_id))
                    if found is not None:
                        self.fire(client, found)
                        return
            except Exception:  # the API away for a moment: ask again next time
                found = None
            if self.asked.is_set():  # a SIGTERM that is no cancel: the process ends as it did before
                self.answered.set()
                return

    def fire(self, client: Any, found: Any) -> None:
        from prefect.states import Cancelling

        from enginefoundry.model_server import stop_all_servers
        from enginefoundry.records.tracking import end_open_runs_cancelled
        from enginefoundry.runner import request_cancel

        self.fired = True
        reason = f"flow run {found.name} is {found.state.name}"
        mark_cancel_intent()  # the SIGTERM that ends this process is a cancel: the run ends Cancelled, not Crashed
        request_cancel(reason)
        self.answered.set()
        try:
            _log(f"cancel: {reason}: stopping this run (servers, unit runs, MLflow runs)")
            stop_all_servers()
            with _LOCK:
                children = list(_CHILDREN)
            for child in children:
                with contextlib.suppress(Exception):  # a child that ended meanwhile
                    run = client.read_flow_run(child)
                    if run.state is not None and not run.state.is_final():
                        client.set_flow_run_state(child, Cancelling(message=f"its parent was cancelled ({reason})"),
                                                  force=True)
            ended = end_open_runs_cancelled(reason)
            _log(f"cancel: MLflow runs ended KILLED: {', '.join(ended) or 'none open'}")
            if found.id != self.flow_run_id:
                with contextlib.suppress(Exception):
                    client.set_flow_run_state(self.flow_run_id, Cancelling(message=f"cancelled with {reason}"),
                                              force=True)
        finally:
            self.cleaned.set()
        if not self.supervised:
            atexit.register(_end_cancelled, self.flow_run_id)
            os.kill(os.getpid(), signal.SIGTERM)  # the main thread unwinds through its `finally` blocks

    def on_sigterm(self) -> None:
        """In the main thread, as SIGTERM arrives (a worker's kill of a cancelled run can come before the next
        poll): let the watcher look now, briefly, so a cancel is marked as one before Prefect's handler turns the
        signal into its TerminationSignal; the cleanup goes on in the watcher's thread (waited for at exit)."""
        if self.done.is_set() or not self.thread.is_alive():
            return
        self.asked.set()
        self.answered.wait(ANSWER_WAIT_S)
        if self.fired:  # a cancel: the exit waits for its cleanup (a SIGTERM that is no cancel exits as before)
            atexit.register(self.cleaned.wait, CLEANUP_WAIT_S)


def mark_cancel_intent() -> bool:
    """Record "cancel" as the intent of the SIGTERM that is coming, as a runner does over its control channel
    before its kill: the flow engine then ends the run Cancelled (`handle_cancellation`) instead of forcing Crashed
    with "Execution was aborted by a termination signal" (`handle_crash` for a SIGTERM without that intent,
    prefect/flow_engine.py@3.9.1; measured: the process worker's kill of a cancelled build and of its unit ended
    both Crashed). False, nothing done, on a Prefect release it was not measured on."""
    from enginefoundry._startup import measured

    try:
        version = metadata.version("prefect")
    except metadata.PackageNotFoundError:
        return False
    if not measured(version, MEASURED_PREFECT, (CANCEL_INTENT,)):
        return False
    from prefect._internal import control_listener

    control_listener._set_intent("cancel")
    return True


def _log(message: str) -> None:
    from enginefoundry.console import say

    try:
        from prefect import get_run_logger

        get_run_logger().error(message)
    except Exception:
        say(message)


def _end_cancelled(flow_run_id: UUID) -> None:
    """At exit of a run no runner supervises: Cancelling → Cancelled (what a worker does after its kill)."""
    from prefect.states import Cancelled

    with contextlib.suppress(Exception), _client() as client:
        run = client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.type.value == "CANCELLING":
            client.set_flow_run_state(flow_run_id, Cancelled(message="cancelled: stopped by enginefoundry"),
                                      force=True)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Watch the current flow run (and its ancestors) for a cancel while the body runs."""
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        yield
        return
    # A process that a Prefect runner or worker started carries its flow run id in the environment: the runner
    # kills it on Cancelling. Otherwise (the CLI) nobody would.
    supervised = os.environ.get("PREFECT__FLOW_RUN_ID") == str(flow_run_id)
    watch = _Watch(flow_run_id, supervised)
    watch.thread.start()
    previous = _on_sigterm_first(watch)
    try:
        yield
    finally:
        watch.done.set()
        watch.asked.set()  # wake it: it ends
        if previous is not None and signal.getsignal(signal.SIGTERM) is not previous:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, previous)


def _on_sigterm_first(watch: _Watch) -> Any | None:
    """A SIGTERM handler that asks the watcher first, then does what the one before it did (main thread only).
    Returns the handler it replaced (None: not installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        watch.on_sigterm()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return previous
