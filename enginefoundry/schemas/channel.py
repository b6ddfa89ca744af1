"""A toolchain channel (`toolchain.channel` of a spec): a small YAML or JSON document a platform team publishes,
naming the current toolchain; rollout/toolchain_channel.py reads it (YAML, bounded) and builds with its value."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field, model_validator

from enginefoundry.schemas.base import Document

VERSION_PATTERN = r"^[0-9]+\.[0-9]+(\.[0-9]+)?([a-z0-9.+-]{0,32})$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$"


class ChannelDocument(Document):
    """A toolchain channel's document: the toolchain a rollout builds with (at least a TensorRT-LLM release or an
    image digest)."""

    SCHEMA_NAME: ClassVar[str] = "toolchain-channel"
    MAX_BYTES: ClassVar[int] = 64 * 1024

    model_config = ConfigDict(extra="forbid", frozen=True)

    trtllm_version: str | None = Field(default=None, pattern=VERSION_PATTERN, description="e.g. 1.3.0rc23")
    image: str | None = Field(default=None, pattern=IMAGE_PATTERN, description="e.g. nvcr.io/…/tritonserver:26.07")
    image_digest: str | None = Field(default=None, pattern=DIGEST_PATTERN, description="sha256:<64 hex>")

    @model_validator(mode="after")
    def _names_something(self) -> ChannelDocument:
        if self.trtllm_version is None and self.image_digest is None:
            raise ValueError("names neither trtllm_version nor image_digest: publish at least one")
        return self

    def describe(self) -> str:
        parts = [f"TensorRT-LLM {self.trtllm_version}"] if self.trtllm_version else []
        if self.image_digest:
            parts.append(f"image {self.image_digest[:19]}")
        return ", ".join(parts)
