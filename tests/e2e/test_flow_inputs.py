"""A bad input fails a build-engines run with one clean state message that names the field and the fix (no
traceback in the run's logs); pasted YAML is read as a spec. Prefect's ephemeral API, nothing is built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.flows.build_engines import build_engines

REPO = Path(__file__).resolve().parents[2]


def _logs(flow_run_id) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


@pytest.fixture(autouse=True)
def _patient_ephemeral_server() -> Iterator[None]:
    """On a busy machine the ephemeral API takes longer than Prefect's default 20 s to start."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 180}):
        yield


def test_bad_inputs_fail_the_run_with_one_clean_message(tmp_path: Path) -> None:
    missing = build_engines(spec_path=str(tmp_path / "nope.yaml"), return_state=True)
    assert missing.is_failed()
    assert "nope.yaml does not exist; pass a spec such as configs/tiny-cpu.yaml" in missing.message
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["variants"][0]["precission"] = "fp16"
    typo = build_engines(spec_yaml=yaml.safe_dump(data), return_state=True)
    assert typo.is_failed()
    assert "variants.0.precission: unknown key" in typo.message and "spec_yaml" in typo.message
    for state in (missing, typo):
        assert "Traceback" not in state.message and "Traceback" not in _logs(state.state_details.flow_run_id)
    # A Python caller (the CLI) gets the error itself, so it exits 2 with the same message.
    with pytest.raises(SpecError, match="not valid YAML at line 2"):
        build_engines(spec_yaml="name: x\nmodel: [")
