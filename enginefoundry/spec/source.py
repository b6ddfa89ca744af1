"""The model source: where a checkpoint comes from, parsed from one URI string."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from enginefoundry.confine import SAFE_NAME, normalise_prefix

_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_S3 = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(?P<prefix>.*))?$")


class SourceKind(StrEnum):
    HF = "hf"
    S3 = "s3"
    LOCAL = "local"


class SourceURI(BaseModel):
    """A parsed source: `hf://org/name@revision`, `s3://bucket/prefix`, `file:///path` or a plain path."""

    model_config = ConfigDict(frozen=True)

    kind: SourceKind
    location: str  # repo id, "bucket/prefix" or a path
    revision: str | None = None  # hf only; a branch, tag or commit sha
    # hf only: which repo files to fetch (fnmatch patterns, as huggingface_hub's snapshot_download takes them);
    # None for ignore_patterns means enginefoundry.inputs.sources.DEFAULT_IGNORE_PATTERNS.
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None

    @property
    def uri(self) -> str:
        if self.kind is SourceKind.HF:
            return f"hf://{self.location}@{self.revision or 'main'}"
        if self.kind is SourceKind.S3:
            return f"s3://{self.location}"
        return self.location


def parse_source_uri(raw: str) -> SourceURI:
    """Parse a source URI; raise ValueError with the accepted forms when it is malformed."""
    raw = raw.strip()
    if raw.startswith("hf://"):
        body = raw[len("hf://") :]
        repo, _, rev = body.partition("@")
        if not _HF_REPO.match(repo):
            raise ValueError(
                f"'{raw}' is not a Hugging Face source: expected hf://org/name[@revision], "
                "e.g. hf://meta-llama/Llama-3.1-8B-Instruct@main"
            )
        if "@" in body and not rev:
            raise ValueError(f"'{raw}' has an empty revision after '@': give a branch, tag or commit sha")
        return SourceURI(kind=SourceKind.HF, location=repo, revision=rev or "main")
    if raw.startswith("s3://"):
        m = _S3.match(raw)
        prefix = normalise_prefix(m.group("prefix") or "", f"the prefix of '{raw}'") if m else ""
        if not m or not prefix:
            raise ValueError(f"'{raw}' is not an S3 source: expected s3://bucket/prefix/ (a folder of the checkpoint)")
        return SourceURI(kind=SourceKind.S3, location=f"{m.group('bucket')}/{prefix}")
    if raw.startswith("file://"):
        path = raw[len("file://") :]
        if not path:
            raise ValueError(f"'{raw}' has no path: expected file:///absolute/path or a plain path")
        return SourceURI(kind=SourceKind.LOCAL, location=path)
    if "://" in raw:
        scheme = raw.split("://", 1)[0]
        raise ValueError(f"unknown source scheme '{scheme}://': use hf://, s3://, file:// or a plain path")
    if not raw:
        raise ValueError("empty source: use hf://org/name@rev, s3://bucket/prefix, file:///path or a path")
    return SourceURI(kind=SourceKind.LOCAL, location=raw)


class AdapterMode(StrEnum):
    """How a spec's LoRA adapters are served (docs/adapters.md)."""

    MERGE = "merge"  # each adapter merged into the base at conversion (PEFT merge_and_unload): a unit per adapter
    SERVE = "serve"  # one unit serves the base and every adapter, chosen per request by the OpenAI `model` name


ADAPTER_NAME = r"^[a-z0-9][a-z0-9_-]*$"  # part of unit names, alias stems and served model names
MAX_ADAPTERS = 32
# TensorRT-LLM's LoraConfig.max_lora_rank default (lanes/trtllm_flags.py REF_LORA_CONFIG; docs/trtllm-compat.md)
DEFAULT_MAX_LORA_RANK = 64


class AdapterSpec(BaseModel):
    """One LoRA adapter: a Hugging Face PEFT folder (adapter_config.json + adapter_model.safetensors), a source
    like the base (fetched, pinned to a commit, confined and digested the same way)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=ADAPTER_NAME, max_length=48)] = Field(
        description="short adapter name: in unit names, alias stems and the served model name")
    source: str = Field(max_length=1024, description="hf://org/name@revision, s3://bucket/prefix, file:///path or a "
                                                     "path: a PEFT adapter folder")
    base_model: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="the base as the adapter's adapter_config.json names it (base_model_name_or_path), "
                                  "when the spec's model.source is a copy under another name (an S3 prefix, a "
                                  "folder); default: the source's repo id, folder name or model.name")
    traffic_share: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="adapter_mode serve: this adapter's share of the benchmark's requests (the base gets "
                                  "what the adapters' shares leave; adapters without one split it evenly with the "
                                  "base)")

    @field_validator("source")
    @classmethod
    def _valid_uri(cls, value: str) -> str:
        checked_source_uri(value)
        return value

    def parsed_source(self, base_dir: Path | None = None) -> SourceURI:
        """The adapter's source URI; a relative local path is taken relative to `base_dir` (the spec's folder)."""
        return relative_to(parse_source_uri(self.source), base_dir)


def relative_to(src: SourceURI, base_dir: Path | None) -> SourceURI:
    """A local source's relative path taken relative to `base_dir` (the spec's folder); any other as it is."""
    if src.kind is SourceKind.LOCAL and base_dir is not None and not Path(src.location).is_absolute():
        return SourceURI(kind=SourceKind.LOCAL, location=str((base_dir / src.location).resolve()))
    return src


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="hf://org/name@revision, s3://bucket/prefix, file:///path or a path")
    name: Annotated[str, Field(pattern=SAFE_NAME, max_length=100)] = Field(
        description="Short model name used in store paths and MLflow names"
    )
    tokenizer: str | None = Field(default=None, description="Tokenizer source when it is not inside the checkpoint")
    unquantized: str | None = Field(
        default=None, description="a pre-quantized source's unquantized original (the same URIs as source): the "
        "smoke gate judges the quantization's own cost (rule `quantization cost`) against it")
    allow_patterns: list[str] | None = Field(
        default=None, description="hf sources: fetch only repo files matching one of these (fnmatch) patterns")
    ignore_patterns: list[str] | None = Field(
        default=None, description="hf sources: skip repo files matching these patterns; default: duplicate weight "
        "formats (original/*, *.pth, *.gguf, onnx/*, *.msgpack, *.h5, and *.bin when safetensors exist); "
        "[] fetches every file")
    adapters: list[AdapterSpec] = Field(
        default_factory=list, max_length=MAX_ADAPTERS,
        description="LoRA adapters of this base (Hugging Face PEFT folders); see adapter_mode")
    adapter_mode: AdapterMode = Field(
        default=AdapterMode.MERGE, description="merge: each adapter merged into the base at conversion, one unit per "
                                               "adapter; serve: one unit serves the base and every adapter")
    max_lora_rank: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=DEFAULT_MAX_LORA_RANK, description="the largest LoRA rank an adapter may have (the lane may allow "
                                                   "less: its own max_lora_rank)")

    @property
    def serves_adapters(self) -> bool:
        """One unit serves the base and every adapter per request (adapters in adapter_mode serve)."""
        return bool(self.adapters) and self.adapter_mode is AdapterMode.SERVE

    @property
    def merges_adapters(self) -> bool:
        """Each adapter merged into the base, a unit per adapter (adapters in adapter_mode merge)."""
        return bool(self.adapters) and self.adapter_mode is AdapterMode.MERGE

    @field_validator("source", "tokenizer", "unquantized")
    @classmethod
    def _valid_uri(cls, value: str | None) -> str | None:
        return checked_source_uri(value)

    @model_validator(mode="after")
    def _distinct_adapters(self) -> ModelSpec:
        names = [a.name for a in self.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"adapters must have distinct names; repeated: {', '.join(dupes)}")
        if self.adapter_mode is AdapterMode.SERVE and self.name in names:
            raise ValueError(f"adapter_mode serve: an adapter named '{self.name}' (model.name) would be asked by the "
                             "base's model name; rename the adapter")
        shares = [a.traffic_share for a in self.adapters if a.traffic_share is not None]
        if shares and self.adapter_mode is not AdapterMode.SERVE:
            raise ValueError("adapters[].traffic_share is the benchmark's mix of one unit serving every adapter: set "
                             "adapter_mode: serve, or remove traffic_share (merge mode benchmarks each adapter's unit "
                             "alone)")
        if sum(shares) > 1 + 1e-9:
            raise ValueError(f"adapters[].traffic_share add up to {sum(shares):g}, over 1: lower them (the base gets "
                             "what they leave)")
        return self

    @model_validator(mode="after")
    def _patterns_for_hub_sources(self) -> ModelSpec:
        if (self.allow_patterns is not None or self.ignore_patterns is not None) \
                and parse_source_uri(self.source).kind is not SourceKind.HF:
            raise ValueError("allow_patterns/ignore_patterns select files of a Hugging Face repo (hf:// sources); "
                             "for an S3 prefix or a folder, point the source at a folder holding only the checkpoint")
        return self

    def parsed_unquantized(self, base_dir: Path | None = None) -> SourceURI | None:
        """`unquantized` as a source URI (None where unset); a relative local path as `parsed_source` takes it."""
        if self.unquantized is None:
            return None
        src = parse_source_uri(self.unquantized)
        if src.kind is SourceKind.LOCAL and base_dir is not None and not Path(src.location).is_absolute():
            return SourceURI(kind=SourceKind.LOCAL, location=str((base_dir / src.location).resolve()))
        return src

    def parsed_source(self, base_dir: Path | None = None) -> SourceURI:
        """The source URI; a relative local path is taken relative to `base_dir` (the spec's folder)."""
        src = parse_source_uri(self.source)
        if src.kind is SourceKind.HF and (self.allow_patterns is not None or self.ignore_patterns is not None):
            src = src.model_copy(update={
                "allow_patterns": None if self.allow_patterns is None else tuple(self.allow_patterns),
                "ignore_patterns": None if self.ignore_patterns is None else tuple(self.ignore_patterns)})
        return relative_to(src, base_dir)

    def adapter(self, name: str) -> AdapterSpec:
        """The adapter of that name (KeyError names the known ones)."""
        for a in self.adapters:
            if a.name == name:
                return a
        raise KeyError(f"no adapter '{name}' in model.adapters ({', '.join(a.name for a in self.adapters)})")


def checked_source_uri(value: str | None) -> str | None:
    """A spec field naming a checkpoint source (model.source, model.tokenizer, speculative.draft), as written,
    once parse_source_uri accepts it; a field validator's body."""
    if value is not None:
        parse_source_uri(value)
    return value
