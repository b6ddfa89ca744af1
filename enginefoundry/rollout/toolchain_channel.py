"""A toolchain channel: a small document, published by whoever qualifies toolchains, naming the current one.

`toolchain.channel` in the spec is an `s3://bucket/key`, a `file:///absolute/path` or a path relative to the spec,
holding YAML or JSON `{trtllm_version, image, image_digest}` (at least one of them). `rollout` reads it and builds
with its value, so a platform team that moves the channel moves every spec that follows it; the change report
then says "channel <uri> moved from X to Y". The document is hostile input: at most MAX_BYTES, a strict typed
model (unknown keys refused), every refusal names the field and the fix. A read that fails for a reason the same
call may not have next time (network, missing object) is a ToolError; a document that is wrong is an InputError.
No Prefect here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ValidationError

from enginefoundry.catalog.schemes import SchemeKind, scheme_of
from enginefoundry.errors import SpecError, ToolError, is_transient
from enginefoundry.schemas.channel import ChannelDocument
from enginefoundry.schemas.manifest import ToolchainIdentity
from enginefoundry.spec import BuildSpec

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

MAX_BYTES = ChannelDocument.MAX_BYTES


class ChannelStatus(BaseModel):
    """What `plan` and `validate` show: the channel's current value, or why it could not be read."""

    uri: str
    value: ChannelDocument | None = None
    error: str | None = None
    transient: bool = False

    def line(self) -> str:
        if self.value is not None:
            return f"toolchain channel {self.uri}: {self.value.describe()}"
        what = "could not be read now" if self.transient else "is invalid"
        return f"toolchain channel {self.uri} {what}: {self.error}"


def read_channel(uri: str, base: Path, attempts: int | None = None) -> ChannelDocument:
    """The channel's current document (InputError: the document is wrong; ToolError: it could not be read).
    `attempts`: S3 calls at most (default: the store's retry setting)."""
    row = scheme_of(uri)  # the catalog's scheme rows: an object store, or a path on this machine
    raw = _s3_bytes(uri, attempts) if row is not None and row.kind is SchemeKind.OBJECT else _file_bytes(uri, base)
    return parse_channel(uri, raw)


def parse_channel(uri: str, raw: bytes) -> ChannelDocument:
    field = "toolchain.channel"
    if len(raw) > MAX_BYTES:
        raise SpecError([(field, f"{uri} is larger than {MAX_BYTES} bytes: publish only "
                                 "{trtllm_version, image, image_digest}")])
    try:
        data: object = yaml.safe_load(raw.decode("utf-8"))
    except RecursionError:  # a document nested thousands deep: PyYAML's composer recurses
        raise SpecError([(field, f"{uri} is nested too deep: publish a flat mapping "
                                 "{trtllm_version, image, image_digest}")]) from None
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecError([(field, f"{uri} is not YAML or JSON ({str(err).splitlines()[0]}): publish a mapping "
                                 "{trtllm_version, image, image_digest}")]) from None
    if not isinstance(data, dict):
        raise SpecError([(field, f"{uri} holds a {type(data).__name__}, not a mapping: publish "
                                 "{trtllm_version, image, image_digest}")])
    try:
        return ChannelDocument.model_validate(data)
    except ValidationError as err:
        problems = [(f"{field} ({uri}) " + ".".join(str(p) for p in e["loc"]) if e["loc"] else f"{field} ({uri})",
                     _message(e)) for e in err.errors()]
        raise SpecError(problems) from None


def _message(e: ErrorDetails) -> str:
    if e["type"] == "extra_forbidden":
        return "unknown key: a channel holds only trtllm_version, image, image_digest"
    if e["type"] == "string_type":
        return f"must be a string (got {e['input']!r}): quote it, e.g. \"1.3.0\""
    if e["type"] == "string_pattern_mismatch":
        return f"{e['msg']} (got {str(e['input'])[:80]!r})"
    return str(e["msg"]).removeprefix("Value error, ")


def _file_bytes(uri: str, base: Path) -> bytes:
    row = scheme_of(uri)
    given = row.body(uri) if row else uri
    path = Path(given) if Path(given).is_absolute() else (base / given).resolve()
    if path.exists() and not path.is_file():  # a FIFO would block the read for ever, a device never end it
        raise SpecError([("toolchain.channel", f"{uri} is not a regular file: name the file the publisher writes")])
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_BYTES + 1)
    except OSError as err:
        raise ToolError(f"toolchain channel {uri} cannot be read ({err.strerror or err}): check that the "
                        "publisher wrote it and that this worker can read it") from None


def _s3_bytes(uri: str, attempts: int | None = None) -> bytes:
    from enginefoundry.store.s3 import s3_client

    row = scheme_of(uri)
    bucket, _, key = (row.body(uri) if row else uri).partition("/")
    try:
        body = s3_client(max_attempts=attempts).get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{MAX_BYTES}")["Body"]
        data: bytes = body.read(MAX_BYTES + 1)  # a botocore StreamingBody
        return data
    except Exception as err:  # botocore's errors: missing object, no access, endpoint down
        if is_transient(err):
            raise  # the network task retries it (tasks._retry)
        raise ToolError(f"toolchain channel {uri} cannot be read ({type(err).__name__}: {err}): check the "
                        "object and this worker's S3 endpoint and credentials") from None


def with_channel(spec: BuildSpec) -> tuple[BuildSpec, ChannelDocument | None]:
    """The spec with the channel's current toolchain in place of its pinned fields (those the channel names)."""
    if not spec.toolchain.channel:
        return spec, None
    doc = read_channel(spec.toolchain.channel, spec.base_path)
    named = doc.model_dump(exclude_none=True)
    return spec.model_copy(update={"toolchain": spec.toolchain.model_copy(update=named)}), doc


def channel_status(spec: BuildSpec) -> ChannelStatus | None:
    """For `plan` and `validate`: the channel's value, or why not; a read failure is reported, not raised (an S3
    endpoint that cannot be reached is asked once, not retried: the rollout that reads it retries)."""
    uri = spec.toolchain.channel
    if not uri:
        return None
    try:
        return ChannelStatus(uri=uri, value=read_channel(uri, spec.base_path, attempts=1))
    except SpecError as err:
        return ChannelStatus(uri=uri, error="; ".join(f"{p}: {m}" for p, m in err.problems))
    except ToolError as err:
        return ChannelStatus(uri=uri, error=str(err), transient=True)
    except Exception as err:  # botocore's connection errors, re-raised for the rollout's retries
        if not is_transient(err):
            raise
        return ChannelStatus(uri=uri, error=f"{type(err).__name__}: {' '.join(str(err).split())[:200]}",
                             transient=True)


def channel_moved(uri: str, recorded: ToolchainIdentity | None, current: ToolchainIdentity | None) -> str | None:
    """'channel <uri> moved from X to Y' when the channel's fields differ from the baseline's; else None."""
    now = current or ToolchainIdentity()
    if not recorded or (now.trtllm_version, now.image_digest) == (recorded.trtllm_version, recorded.image_digest):
        return None

    def ident(identity: ToolchainIdentity) -> str:
        pinned = [f"trtllm_version {identity.trtllm_version}"] if identity.trtllm_version is not None else []
        pinned += [f"image_digest {identity.image_digest[:19]}"] if identity.image_digest is not None else []
        return ", ".join(pinned) or "nothing pinned"
    return f"channel {uri} moved from {ident(recorded)} to {ident(now)}"
