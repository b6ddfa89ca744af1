"""The store's, records' and rollout's documents from hostile bytes: a refusal with a message, never a
RecursionError or a traceback (issue 35)."""

from __future__ import annotations

import pytest

from enginefoundry.errors import SpecError
from enginefoundry.rollout.toolchain_channel import parse_channel
from enginefoundry.schemas.base import DocumentError
from enginefoundry.schemas.checkpoint import CheckpointManifest
from enginefoundry.schemas.lease import BrokenLeaseNote, LeaseRecord
from enginefoundry.schemas.outcome import UnitOutcome
from enginefoundry.schemas.pointer import Pointer
from enginefoundry.schemas.verification import VerificationRecord
from enginefoundry.store.lease import _decode

HOSTILE = [b"[" * 100_000, b"{" * 40 + b"}" * 40, b"9" * 5000, b"[NaN]", b"\xff\xfe", b"", b"null", b'{"x": 1}']


@pytest.mark.parametrize("document", [Pointer, CheckpointManifest, LeaseRecord, BrokenLeaseNote, VerificationRecord,
                                      UnitOutcome])
@pytest.mark.parametrize("raw", HOSTILE, ids=lambda r: repr(r[:12]))
def test_a_document_refuses_hostile_bytes_with_its_name(document: type, raw: bytes) -> None:
    with pytest.raises(DocumentError, match=rf"^{document.SCHEMA_NAME}: "):
        document.parse(raw)


def test_a_document_over_its_size_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(DocumentError, match=r"bytes \(at most 65536\)"):
        LeaseRecord.parse(b" " * (LeaseRecord.MAX_BYTES + 1))


@pytest.mark.parametrize("raw", HOSTILE)
def test_a_hostile_lease_reads_as_no_lease(raw: bytes) -> None:
    assert _decode(raw) is None


@pytest.mark.parametrize(("raw", "said"), [
    (b"[" * 20_000 + b"]" * 20_000, "nested too deep"),
    (b"{a: " * 10_000 + b"}" * 10_000, "nested too deep"),
    (b"\xff", "not YAML or JSON"),
    (b"- 1\n", "not a mapping"),
])
def test_a_hostile_channel_is_a_spec_error_naming_the_field(raw: bytes, said: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_channel("chan.yaml", raw)
    assert said in str(err.value) and "toolchain.channel" in str(err.value)
