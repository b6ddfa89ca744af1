"""Prefect flows: composition only, each reads like the DAG (docs/architecture.md#the-dag). The stages are in
tasks/, the domain in enginefoundry/; Prefect's temporary server is run by flows/prefect_server/.

Its face (`__all__`): the flows deployments and the CLI start, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.flows.automations import create_automations
    from enginefoundry.flows.build_engines import build_engines
    from enginefoundry.flows.build_unit import build_unit
    from enginefoundry.flows.fleet import rollout_fleet
    from enginefoundry.flows.rollout import rollout
    from enginefoundry.flows.unit import unit_pipeline

__all__ = ["build_engines", "build_unit", "create_automations", "rollout", "rollout_fleet", "unit_pipeline"]

__getattr__, __dir__ = lazy_face(__name__)
