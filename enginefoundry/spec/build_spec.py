"""The build spec: one YAML file → one validated `BuildSpec`, with every problem reported at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from enginefoundry.catalog.schemes import SchemeKind, object_forms, scheme_of, store_prefixes
from enginefoundry.confine import SAFE_NAME
from enginefoundry.errors import InputError, SpecError
from enginefoundry.spec.checks import BenchmarkSpec, SmokeSpec
from enginefoundry.spec.lane_catalog import explain_unknown_key, lane_names, options_model
from enginefoundry.spec.lane_options import LaneOptions, NoOptions, option_message
from enginefoundry.spec.matrix import Profile, Target, Variant
from enginefoundry.spec.outputs import PublishSpec, TrackingSpec
from enginefoundry.spec.search import LengthsFigures, SearchedUnit, SearchSpec, figures_from
from enginefoundry.spec.siblings import sibling_problems
from enginefoundry.spec.source import ModelSpec
from enginefoundry.spec.speculative import SpeculativeSpec


def channel_uri_problem(uri: str) -> str | None:
    """Why a `toolchain.channel` value cannot be a channel, or None."""
    row = scheme_of(uri)  # the catalog's scheme rows (enginefoundry/catalog/schemes.py)
    if "://" in uri and row is None:
        return f"'{uri}' has a scheme other than {' or '.join(store_prefixes())}: give {object_forms()} or a path"
    if row is not None and row.kind is SchemeKind.OBJECT:
        bucket, _, key = row.body(uri).partition("/")
        if not bucket or not key or key.endswith("/"):
            return f"'{uri}' names no object: give {row.prefix}bucket/key/of/channel.yaml"
    if row is not None and row.kind is SchemeKind.LOCAL and not row.body(uri).startswith("/"):
        return f"'{uri}' is not absolute: give {row.prefix}/absolute/path, or a plain path relative to the spec"
    if "\x00" in uri:
        return "contains a NUL byte: give a plain URI"
    return None


class ToolchainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trtllm_version: str | None = Field(default=None, description="pinned TensorRT-LLM version, e.g. 1.2.1")
    image: str | None = Field(default=None, description="container image the GPU workers run")
    image_digest: str | None = Field(default=None, description="sha256:… digest of that image")
    channel: str | None = Field(default=None, max_length=1024,
                                description="a toolchain channel the spec follows: s3://bucket/key, file:///path or "
                                            "a path relative to the spec, holding {trtllm_version, image, "
                                            "image_digest}; `rollout` builds with its current value "
                                            "(enginefoundry.rollout.toolchain_channel)")

    @field_validator("channel")
    @classmethod
    def _channel_uri(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = channel_uri_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class BuildSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SAFE_NAME, max_length=100, description="spec name, shown in runs")
    model: ModelSpec = Field(description="the checkpoint: where it comes from and its short name")
    lane: str = Field(default="reference", description="a lane of enginefoundry.lanes.registry")
    toolchain: ToolchainSpec = Field(default_factory=ToolchainSpec, description="the TensorRT-LLM toolchain "
                                     "the units are built with (part of the unit key), or the channel to follow")
    # Hand-written variants × profiles; may be empty when `search` decides what to build (docs/search.md).
    variants: list[Variant] = Field(default_factory=list, description="how to convert the checkpoint: precision "
                                    "and parallelism; a unit is variant × profile × target")
    profiles: list[Profile] = Field(default_factory=list, description="shape limits a unit is built for")
    targets: list[Target] = Field(min_length=1, description="GPU architectures (and SKUs) that get their own "
                                  "build, each on a worker of its pool")
    search: SearchSpec | None = Field(default=None, description="decide the variants and profiles from the "
                                      "traffic and the SLO (docs/search.md)")
    # What the search decided (enginefoundry.search.plan.materialise): ordinary units, carried in the payload.
    searched: list[SearchedUnit] = Field(default_factory=list)
    # Speculative decoding for every unit (enginefoundry/spec/speculative.py); the lane says what it supports.
    speculative: SpeculativeSpec | None = None
    # Lane-specific knobs (plugins, CUDA graphs, …): the lane's own options model, chosen by `lane` (a union
    # discriminated by `lane` over the registered lanes). Unknown keys are refused; a removed TensorRT-LLM flag is
    # refused with the release that removed it (the lane's model explains it).
    lane_options: SerializeAsAny[LaneOptions] = Field(default_factory=NoOptions, validate_default=True)
    smoke: SmokeSpec = Field(description="the accuracy gate against a reference (docs/smoke-gate.md)")
    benchmark: BenchmarkSpec = Field(description="the load sweep of each unit that passed its gate")
    publish: PublishSpec = Field(default_factory=PublishSpec, description="the artifact store and signatures")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="MLflow: tracking URI, experiment "
                                   "and registered model")
    # Folder the spec was read from: relative input paths resolve against it. Not part of any key.
    base_dir: str | None = Field(default=None, exclude=True)

    @field_validator("lane")
    @classmethod
    def _known_lane(cls, value: str) -> str:
        if value not in lane_names():
            raise ValueError(f"lane '{value}' is unknown: use one of {', '.join(lane_names())}")
        return value

    @field_validator("lane_options", mode="before")
    @classmethod
    def _options_of_the_lane(cls, value: Any, info: ValidationInfo) -> Any:
        lane = info.data.get("lane")
        if lane not in lane_names():
            return NoOptions()  # the lane itself is reported
        model = options_model(lane)
        if isinstance(value, model):
            return value
        if isinstance(value, LaneOptions):
            value = value.given()
        return model.model_validate(value or {})

    @model_validator(mode="after")
    def _consistent(self) -> BuildSpec:
        if self.search is None and not (self.variants and self.profiles):
            missing = " and ".join(k for k, v in (("variants", self.variants), ("profiles", self.profiles)) if not v)
            raise ValueError(f"{missing}: at least one is needed, or add a `search` section that decides them "
                             "(docs/search.md)")
        if self.variants and not self.profiles:
            raise ValueError("profiles: hand-written variants need at least one profile")
        for kind, items in (("variants", [v.name for v in self.variants]),
                            ("profiles", [p.name for p in self.profiles]),
                            ("targets", [t.name for t in self.targets])):
            dupes = sorted({n for n in items if items.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} must have distinct names; repeated: {', '.join(dupes)}")
        names = {t.name for t in self.targets}
        for v in self.variants:
            unknown = sorted(set(v.targets or []) - names)
            if unknown:
                raise ValueError(f"variant {v.name} names unknown targets {unknown}; known: {sorted(names)}")
        unknown = sorted(set((self.search.targets if self.search else None) or []) - names)
        if unknown:
            raise ValueError(f"search.targets names unknown targets {unknown}; known: {sorted(names)}")
        return self

    @property
    def base_path(self) -> Path:
        return Path(self.base_dir) if self.base_dir else Path.cwd()

    def resolve_path(self, relative: str) -> Path:
        """An input path from the spec, relative to the spec's folder."""
        p = Path(relative)
        return p if p.is_absolute() else (self.base_path / p).resolve()

    @property
    def registered_model_name(self) -> str:
        return self.tracking.registered_model or self.model.name


def _problems(err: ValidationError, data: Mapping[str, object]) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["loc"][:1] == ("lane_options",) and len(e["loc"]) > 1:
            out.append((path, _lane_option_message(e, data)))
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling against the spec reference, docs/reference/spec.md"
            # A removed or renamed TensorRT-LLM flag gets its history and replacement (lanes own that table).
            known = explain_unknown_key(str(e["loc"][-1]))
            if known:
                msg = f"unknown key: {known}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        out.append((path, msg))
    return out


def _lane_option_message(e: ErrorDetails, data: Mapping[str, object]) -> str:
    """The lane's own words for a problem in its options (a removed flag, a spec field, the valid choices)."""
    try:
        model = options_model(str(data.get("lane", "reference")))
    except Exception:
        return e["msg"]
    toolchain = data.get("toolchain")
    pinned = toolchain.get("trtllm_version") if isinstance(toolchain, dict) else None
    return option_message(model, {**e, "loc": e["loc"][1:]}, pinned)


def parse_spec(data: object, source: str = "spec", base_dir: Path | None = None) -> BuildSpec:
    """Validate a spec mapping (`data`: whatever the YAML file held). Raises SpecError listing every problem with its
    field path."""
    if not isinstance(data, dict):
        raise SpecError([("(top level)", "the spec must be a YAML mapping")], source)
    try:
        spec = BuildSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_problems(err, data), source) from None
    problems = sibling_problems(spec) + scenario_problems(spec)
    if problems:
        raise SpecError(problems, source)
    if base_dir is not None:
        spec = spec.model_copy(update={"base_dir": str(base_dir)})
    return with_workload_lengths(spec, source)


def with_workload_lengths(spec: BuildSpec, source: str = "spec") -> BuildSpec:
    """`search.workload.lengths_file` read (relative to the spec) and analysed by
    enginefoundry.spec.lengths: its ISL mean
    and stddev become the workload's. A payload that carries the figures but not the file keeps them."""
    from enginefoundry.spec.lengths import file_lengths

    w = spec.search.workload if spec.search else None
    if w is None or w.lengths_file is None:
        return spec
    field = "search.workload.lengths_file"
    path = spec.resolve_path(w.lengths_file)
    if not path.is_file() and w.lengths is not None:
        return spec
    try:
        report, sha = file_lengths(path)
    except InputError as err:
        raise SpecError([(field, f"{err}; give a JSONL of {{\"tokens\": N}} records (check it with "
                                 f"`enginefoundry lengths FILE`), or isl/isl_stddev instead")], source) from None
    lengths = LengthsFigures(file=w.lengths_file, sha256=sha, count=report.count, mean=report.mean,
                             stddev=report.stddev, p50=report.p50, p99=report.p99)
    isl, isl_stddev = figures_from(lengths)
    if isl > 1_000_000:
        raise SpecError([(field, f"mean input length {isl} is over 1,000,000 tokens")], source)
    workload = w.model_copy(update={"isl": isl, "isl_stddev": isl_stddev, "lengths": lengths})
    assert spec.search is not None
    return spec.model_copy(update={"search": spec.search.model_copy(update={"workload": workload})})


def scenario_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """Every benchmark scenario runs on every unit: its mean input must fit each profile's max_input_len and its
    mean input plus output each profile's max_seq_len (a 5000-token scenario on a 128-token profile is refused
    here, not by the server after the build)."""
    if not spec.benchmark.enabled:
        return []
    out = []
    for i, sc in enumerate(spec.benchmark.scenarios):
        for prof in spec.profiles:
            if sc.input_tokens_mean > prof.max_input_len:
                out.append((f"benchmark.scenarios.{i}.input_tokens_mean",
                            f"{sc.input_tokens_mean} exceeds profile {prof.name}'s max_input_len "
                            f"({prof.max_input_len}); lower it or raise the profile's limit"))
            elif sc.input_tokens_mean + sc.output_tokens_mean > prof.max_seq_len:
                out.append((f"benchmark.scenarios.{i}.output_tokens_mean",
                            f"input {sc.input_tokens_mean} + output {sc.output_tokens_mean} exceeds profile "
                            f"{prof.name}'s max_seq_len ({prof.max_seq_len}); lower them or raise the limit"))
    return out


def load_spec(path: str | Path) -> BuildSpec:
    """Read and validate a spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError([("(file)", f"{p} does not exist; pass a spec such as configs/tiny-cpu.yaml")], str(p))
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise SpecError([("(yaml)", f"not valid YAML: {err}")], str(p)) from None
    return parse_spec(data, source=str(p), base_dir=p.resolve().parent)
