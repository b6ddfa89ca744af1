"""A toolchain channel the spec follows (issue 23, deliverable 3): the document is hostile input (strict model,
bounded size, refusals that name the field and the fix); `rollout` builds with its value and says the channel
moved; `plan`/`validate` show it, or that it could not be read, without raising."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError, ToolError
from enginefoundry.rollout.toolchain_channel import (
    MAX_BYTES,
    channel_moved,
    channel_status,
    parse_channel,
    read_channel,
    with_channel,
)
from enginefoundry.schemas.manifest import ToolchainIdentity
from enginefoundry.spec import parse_spec
from tests.support.paths import REPO

DIGEST = "sha256:" + "c" * 64


def spec_with(tmp_path: Path, toolchain: dict):
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["toolchain"] = toolchain
    return parse_spec(data, base_dir=tmp_path)


def test_rollout_builds_with_the_channels_value_in_place_of_the_pins(tmp_path: Path):
    (tmp_path / "chan.yaml").write_text(f"trtllm_version: 1.3.0rc23\nimage_digest: {DIGEST}\n")
    spec = spec_with(tmp_path, {"trtllm_version": "1.2.1", "channel": "chan.yaml"})
    resolved, doc = with_channel(spec)
    assert (resolved.toolchain.trtllm_version, resolved.toolchain.image_digest) == ("1.3.0rc23", DIGEST)
    assert resolved.toolchain.channel == "chan.yaml"
    assert doc.describe() == "TensorRT-LLM 1.3.0rc23, image sha256:cccccccccccc"
    assert with_channel(spec_with(tmp_path, {"trtllm_version": "1.2.1"}))[0].toolchain.trtllm_version == "1.2.1"
    assert read_channel(f"file://{tmp_path}/chan.yaml", Path("/")) == doc  # file:// and JSON read the same
    assert parse_channel("j", f'{{"trtllm_version": "1.3.0rc23", "image_digest": "{DIGEST}"}}'.encode()) == doc


@pytest.mark.parametrize(("raw", "says"), [
    (b"image_digst: x\ntrtllm_version: 1.3.0\n", "image_digst: unknown key: a channel holds only"),
    (b"trtllm_version: 1.3\n", 'must be a string (got 1.3): quote it'),
    (b"image_digest: sha256:abc\n", "image_digest: String should match pattern"),
    (b"image: nvcr.io/nvidia/tritonserver:26.07\n", "names neither trtllm_version nor image_digest"),
    (b"- 1.3.0\n", "holds a list, not a mapping"),
    (b"a: [\n", "is not YAML or JSON"),
    (b"trtllm_version: 1.3.0\n" + b"#" * MAX_BYTES, f"larger than {MAX_BYTES} bytes"),
])
def test_a_hostile_channel_document_is_refused_with_the_field_and_the_fix(raw: bytes, says: str):
    with pytest.raises(SpecError) as err:
        parse_channel("s3://qa/channel.yaml", raw)
    assert "toolchain.channel" in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("uri", ["http://qa/channel.yaml", "s3://qa", "s3://qa/dir/", "file://relative.yaml"])
def test_a_channel_that_is_no_object_is_refused_by_the_spec(tmp_path: Path, uri: str):
    with pytest.raises(SpecError) as err:
        spec_with(tmp_path, {"channel": uri})
    assert "toolchain.channel" in str(err.value)


def test_plan_and_validate_see_the_channel_or_why_not_without_raising(tmp_path: Path):
    spec = spec_with(tmp_path, {"channel": "chan.yaml"})
    missing = channel_status(spec)
    assert missing.value is None and missing.transient and "could not be read now" in missing.line()
    with pytest.raises(ToolError):  # a rollout does not build on a channel it cannot read
        with_channel(spec)
    (tmp_path / "chan.yaml").write_text("trtllm_version: 1.3\n")
    invalid = channel_status(spec)
    assert not invalid.transient and "is invalid" in invalid.line() and "quote it" in invalid.line()
    (tmp_path / "chan.yaml").write_text(f"image_digest: {DIGEST}\n")
    assert channel_status(spec).line() == "toolchain channel chan.yaml: image sha256:cccccccccccc"
    assert channel_status(spec_with(tmp_path, {})) is None


def test_the_trigger_says_the_channel_moved_from_x_to_y():
    def identity(**fields: object) -> ToolchainIdentity:
        return ToolchainIdentity.model_validate(fields)

    old = identity(lane="reference", trtllm_version="1.2.1", image_digest="sha256:" + "a" * 64, versions={})
    assert channel_moved("s3://qa/ch.yaml", old, old.model_copy()) is None
    assert channel_moved("s3://qa/ch.yaml", None, old) is None  # an old manifest without a toolchain: not a move
    assert channel_moved("s3://qa/ch.yaml", identity(), old) is None
    moved = channel_moved("s3://qa/ch.yaml", old, old.model_copy(update={"trtllm_version": "1.3.0rc23",
                                                                         "image_digest": DIGEST}))
    assert moved == ("channel s3://qa/ch.yaml moved from trtllm_version 1.2.1, image_digest sha256:aaaaaaaaaaaa "
                     "to trtllm_version 1.3.0rc23, image_digest sha256:cccccccccccc")


def test_an_s3_channel_that_cannot_be_reached_is_not_fatal_to_plan_and_validate(tmp_path: Path, monkeypatch, capsys):
    """Issue 34: docs/rollout.md says a channel that cannot be read is shown, not fatal, in `plan` and `validate`; an S3
    endpoint nobody answers made both exit 1 with botocore's error. It is asked once (connection refused on a
    closed loopback port: no server, no wait) and reported as could not be read now."""
    from enginefoundry.cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(REPO / "tests" / "fixtures" / "tiny-chat" / "model")
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    data["toolchain"] = {"channel": "s3://qa/channel.yaml"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    status = channel_status(parse_spec(data, base_dir=tmp_path))
    assert status.value is None and status.transient and "could not be read now" in status.line()
    assert main(["validate", str(path)]) == 0
    assert "could not be read now" in capsys.readouterr().out
