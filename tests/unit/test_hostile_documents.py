"""Hostile bytes in the documents of build, lanes, evidence and gpu are refused with a message, never a traceback.

Each reader below takes bytes someone else wrote (a store anyone with write access fills, a checkpoint folder, a
bundle handed over, a tool's output): nesting past the bound, a number of thousands of digits, a non-object and
plain garbage each end in the reader's own error naming the file, not a RecursionError or a stray ValueError.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from enginefoundry.errors import InputError, ToolError
from enginefoundry.evidence.signing import STATEMENT_TYPE, SignatureError, open_bundle
from enginefoundry.inputs.model_config import read_config
from enginefoundry.inputs.model_shape import read_model_config
from enginefoundry.lanes.base import BUNDLE_INFO, BundleInfo
from enginefoundry.lanes.trtllm_base import json_object
from enginefoundry.schemas.attestation_index import AttestationIndex
from enginefoundry.schemas.base import DocumentError

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
HUGE_NUMBER = '{"a": ' + "9" * 5000 + "}"  # int() of 5,000 digits raises ValueError past Python's limit
HOSTILE = {"deep": DEEP, "huge-number": HUGE_NUMBER, "not-json": "{nope", "not-utf8": b"\xff\xfe{}",
           "nan": '{"a": NaN}'}


def _bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_an_attestation_index_is_parsed_within_bounds(raw: str | bytes) -> None:
    with pytest.raises(DocumentError, match="attestation-index"):
        AttestationIndex.parse(_bytes(raw))


def test_an_attestation_index_of_the_wrong_shape_names_the_field() -> None:
    with pytest.raises(DocumentError, match=r"attestation-index: signer: Field required"):
        AttestationIndex.parse(json.dumps({"manifest_key": "k", "manifest_sha256": "0" * 64, "signed_at": "t",
                                           "attestations": []}))
    index = AttestationIndex.parse(json.dumps({
        "manifest_key": "k", "manifest_sha256": "0" * 64, "signed_at": "t",
        "signer": {"identity": "ci", "key_id": "ab"},
        "attestations": [{"kind": "gate", "predicate_type": "p", "sha256": "a" * 64, "size": 3}]}))
    assert index.attestations[0].kind == "gate" and index.schema_version == 1


@pytest.mark.parametrize("payload", [DEEP, HUGE_NUMBER, "{nope"], ids=["deep", "huge-number", "not-json"])
def test_a_signed_bundle_whose_payload_is_hostile_is_a_signature_error(payload: str) -> None:
    envelope = {"payloadType": "application/vnd.in-toto+json",
                "payload": base64.b64encode(payload.encode()).decode(), "signatures": []}
    with pytest.raises(SignatureError, match="the payload"):
        open_bundle(json.dumps({"dsseEnvelope": envelope}).encode())
    with pytest.raises(SignatureError, match="the bundle"):
        open_bundle(payload.encode())
    fine = base64.b64encode(json.dumps({"_type": STATEMENT_TYPE, "subject": []}).encode()).decode()
    assert open_bundle(json.dumps({"dsseEnvelope": {**envelope, "payload": fine}}).encode()).statement["subject"] == []


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_checkpoint_config_json_is_read_within_bounds(tmp_path: Path, raw: str | bytes) -> None:
    (tmp_path / "config.json").write_bytes(_bytes(raw))
    with pytest.raises(InputError, match=r"config\.json"):
        read_model_config(tmp_path)
    assert read_config(tmp_path / "config.json") is None  # the lookup goes on to its next place


def test_a_checkpoint_config_json_that_is_no_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        read_model_config(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert read_model_config(tmp_path) == {"architectures": ["LlamaForCausalLM"]}


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_bundle_json_is_read_within_bounds(tmp_path: Path, raw: str | bytes) -> None:
    (tmp_path / BUNDLE_INFO).write_bytes(_bytes(raw))
    with pytest.raises(InputError, match="rebuild the bundle"):
        BundleInfo.read(tmp_path)


def test_a_bundle_json_reads_its_gpu_and_host_facts_typed(tmp_path: Path) -> None:
    (tmp_path / BUNDLE_INFO).write_text(json.dumps({
        "lane": "trtllm", "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0", "arch": "sm90",
                                    "memory_total_mib": 143771, "driver_version": None}],
        "host": {"machine": "x86_64", "cpu_count": 16}, "device": {"device": "cpu", "torch": "2.9"}}))
    info = BundleInfo.read(tmp_path)
    assert info.gpus[0].get("arch") == "sm90" and info.host.get("cpu_count") == 16
    (tmp_path / BUNDLE_INFO).write_text(json.dumps({"gpus": [{"memory_total_mib": "lots"}]}))
    with pytest.raises(InputError, match=r"gpus\.0\.memory_total_mib"):
        BundleInfo.read(tmp_path)


@pytest.mark.parametrize("raw", [DEEP, HUGE_NUMBER, "{nope", "[1]"], ids=["deep", "huge-number", "not-json", "array"])
def test_a_tools_json_output_is_a_tool_error(raw: str) -> None:
    with pytest.raises(ToolError, match="the probe"):
        json_object(raw, "the probe")


@pytest.mark.parametrize("raw", [DEEP, HUGE_NUMBER, "{nope", '{"a": 1}'],
                         ids=["deep", "huge-number", "not-json", "not-objects"])
def test_a_safetensors_header_is_read_within_bounds(tmp_path: Path, raw: str) -> None:
    import struct

    from enginefoundry.inputs.checkpoint_cast import read_header

    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw.encode())
    with pytest.raises(InputError, match="not a safetensors file"):
        read_header(path)


@pytest.mark.parametrize("raw", [DEEP, HUGE_NUMBER, "{nope", "[]"], ids=["deep", "huge-number", "not-json", "array"])
def test_a_benchmark_export_is_read_within_bounds(tmp_path: Path, raw: str) -> None:
    from enginefoundry.bench.parsers import parse_aiperf

    export = tmp_path / "profile_export_aiperf.json"
    export.write_text(raw)
    with pytest.raises(ToolError, match=r"profile_export_aiperf\.json"):
        parse_aiperf(export, scenario="s", concurrency=1, requested=1)


@pytest.mark.parametrize("raw", [DEEP, HUGE_NUMBER, "{nope", "[1]"], ids=["deep", "huge-number", "not-json", "array"])
def test_a_toolchain_probe_result_line_is_read_within_bounds(raw: str) -> None:
    from enginefoundry.inputs.toolchain import PROBE_MARKER, parse_probe_output

    with pytest.raises(ToolError, match="malformed result line"):
        parse_probe_output(f"banner\n{PROBE_MARKER}{raw}\n")
