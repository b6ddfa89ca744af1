"""The unit status is one enum: manifests written with plain strings read back as members, a published manifest is
a candidate or rejected (never failed), and MLflow's plain tag strings compare equal to the members."""

from __future__ import annotations

import json

import jsonschema
import pydantic
import pytest

from enginefoundry.records.outcomes import verdict
from enginefoundry.store.manifest import Manifest, validate_against_schema
from enginefoundry.store.unit_status import UnitStatus


def _manifest(status: str) -> Manifest:
    return Manifest(key="k", key_components={}, model="m", unit="u", lane="reference", target={}, variant={},
                    profile={}, source={}, files=[{"path": "a", "size": 1, "sha256": "0" * 64}], status=status)


@pytest.mark.parametrize("status", ["candidate", "rejected"])
def test_a_manifest_written_with_a_plain_string_reads_back_as_the_member(status: str) -> None:
    read = Manifest.model_validate_json(_manifest(status).to_json())
    assert read.status is UnitStatus(status)
    assert json.loads(read.to_json())["status"] == status  # the bytes a reader sees are unchanged


def test_a_failed_unit_has_no_manifest() -> None:
    with pytest.raises(pydantic.ValidationError, match="status"):
        _manifest("failed")
    data = json.loads(_manifest("candidate").to_json()) | {"status": "failed"}
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(data)


def test_a_tag_string_compares_equal_to_its_member() -> None:
    tags = {"enginefoundry.status": "candidate"}  # as MLflow hands tags back: plain strings
    assert tags["enginefoundry.status"] == UnitStatus.CANDIDATE
    assert UnitStatus.REJECTED != "candidate"
    assert f"{UnitStatus.FAILED}" == "failed"  # what a summary line and an event name print


def test_a_unit_with_neither_report_is_a_candidate() -> None:
    judged = verdict(None, None)
    assert judged.status is UnitStatus.CANDIDATE and judged.ok
