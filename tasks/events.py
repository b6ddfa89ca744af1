"""Prefect events the pipeline emits, so automations can alert on a rejected unit or deploy on a promotion.

    enginefoundry.unit.published | .rejected | .failed    resource enginefoundry.unit.<model>.<unit>
    enginefoundry.model.promoted | .rolled-back           resource enginefoundry.model.<registered model>.<stem>

automations.yaml (repository root) holds automations over them; `enginefoundry automations create` installs it.
Emitting never fails a stage: an event that cannot be sent is logged and dropped.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from enginefoundry.store.unit_status import UnitStatus

UNIT_PUBLISHED = "enginefoundry.unit.published"
UNIT_REJECTED = "enginefoundry.unit.rejected"
UNIT_FAILED = "enginefoundry.unit.failed"
MODEL_PROMOTED = "enginefoundry.model.promoted"
MODEL_ROLLED_BACK = "enginefoundry.model.rolled-back"

UNIT_EVENT_BY_STATUS: dict[str, str] = {UnitStatus.CANDIDATE: UNIT_PUBLISHED, UnitStatus.REJECTED: UNIT_REJECTED,
                        UnitStatus.FAILED: UNIT_FAILED}


def unit_resource(model: str, unit: str, target: str, key: str | None) -> dict[str, str]:
    return {"prefect.resource.id": f"enginefoundry.unit.{model}.{unit}", "prefect.resource.name": unit,
            "enginefoundry.model": model, "enginefoundry.target": target, "enginefoundry.key": key or ""}


def alias_resource(registered_model: str, stem: str) -> dict[str, str]:
    return {"prefect.resource.id": f"enginefoundry.model.{registered_model}.{stem}",
            "prefect.resource.name": f"{registered_model}@{stem}", "enginefoundry.registered-model": registered_model,
            "enginefoundry.alias-stem": stem}


def emit(event: str, resource: dict[str, str], payload: dict[str, Any],  # JSON edge: the event's payload
         related: list[dict[str, str]] | None = None) -> bool:
    """Send one event (Prefect adds the current flow run and flow as related resources). True when sent."""
    from prefect.events import emit_event

    from enginefoundry.tasks._log import progress_logger

    try:
        sent = emit_event(event=event, resource=resource, payload={k: v for k, v in payload.items() if v is not None},
                          related=related or [])
    except Exception as err:  # an event is a notification, never a reason to fail a build
        progress_logger()(f"event {event} not sent: {type(err).__name__}: {err}")
        return False
    return sent is not None


def emit_unit_outcome(model: str, unit: str, target: str, key: str | None, status: str, *, reason: str = "",
                      manifest_uri: str | None = None, mlflow_run_id: str | None = None) -> bool:
    event = UNIT_EVENT_BY_STATUS.get(status)
    if event is None:
        return False
    return emit(event, unit_resource(model, unit, target, key),
                {"status": status, "reason": reason, "manifest_uri": manifest_uri, "mlflow_run_id": mlflow_run_id})


def emit_registry_move(registered_model: str, stem: str, action: str, version: str, previous: str | None,
                       detail: str, *, outside_flows: bool = False) -> bool:
    """promoted / rolled back. From the CLI (`outside_flows`), only where a Prefect server is configured: no
    ephemeral server is started just to send one event."""
    if outside_flows and not os.environ.get("PREFECT_API_URL"):
        return False
    event = {"promoted": MODEL_PROMOTED, "rolled back": MODEL_ROLLED_BACK}.get(action)
    if event is None:
        return False
    sent = emit(event, alias_resource(registered_model, stem),
                {"version": version, "previous": previous, "detail": detail})
    if sent and outside_flows:
        flush_events()
    return sent


def flush_events(timeout_s: float = 15.0) -> None:
    """Wait (bounded) until Prefect's events worker has sent what is queued. A CLI command that exits right after
    emitting otherwise leaves the event to the exit-time drain, which prints "Still processing items: 1 items
    remaining..." (prefect/_internal/concurrency/services.py@3.9.1, QueueService._main_loop)."""
    from prefect.events.worker import EventsWorker

    waiter = threading.Thread(target=EventsWorker.instance().wait_until_empty, daemon=True)
    waiter.start()
    waiter.join(timeout_s)
