"""A toolchain channel on real SeaweedFS: read by its s3:// URI, bounded (a ranged read, never the whole object),
and a missing object reported by `plan`/`validate` as unreadable, not raised."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.rollout.toolchain_channel import MAX_BYTES, ChannelDocument, channel_status, read_channel
from enginefoundry.spec import parse_spec
from tests.support.paths import REPO

pytestmark = pytest.mark.services
DIGEST = "sha256:" + "d" * 64


def test_an_s3_channel_is_read_bounded_and_a_missing_one_is_reported(s3, s3_env: dict[str, str], unique: str):
    uri = f"s3://enginefoundry/channel-{unique}/trtllm.json"
    key = uri.removeprefix("s3://enginefoundry/")
    s3.put_object(Bucket="enginefoundry", Key=key, Body=f'{{"image_digest": "{DIGEST}"}}'.encode())
    assert read_channel(uri, Path("/")) == ChannelDocument(image_digest=DIGEST)
    s3.put_object(Bucket="enginefoundry", Key=key, Body=b"image_digest: x\n" + b"#" * (4 * MAX_BYTES))
    with pytest.raises(SpecError, match=f"larger than {MAX_BYTES} bytes"):
        read_channel(uri, Path("/"))

    data = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    data["toolchain"] = {"channel": f"s3://enginefoundry/channel-{unique}/absent.yaml"}
    status = channel_status(parse_spec(data, base_dir=REPO / "configs"))
    assert status.value is None and status.transient and "cannot be read (NoSuchKey" in status.error
