"""The unit statuses live with the manifest in `enginefoundry.schemas.unit_status`; re-exported for the store."""

from enginefoundry.schemas.unit_status import PASSED_GATES, RegistryStatus, UnitStatus

__all__ = ["PASSED_GATES", "RegistryStatus", "UnitStatus"]
