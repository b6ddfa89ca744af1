"""The `search` section: the traffic, the latency SLO, the GPU budget and the objective; the pipeline decides which
variants and profiles to build (predict, then verify; docs/search.md). Searched units are ordinary units: the
materialised choice is kept in `searched`, so a spec payload carries exactly what was decided."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from enginefoundry.errors import SpecError
from enginefoundry.spec.matrix import Disagg as Disagg  # re-exported: the variant's field is its home
from enginefoundry.spec.matrix import Precision, Profile, Variant
from enginefoundry.spec.matrix import Worker as Worker


class Objective(StrEnum):
    TOKENS_PER_GPU = "tokens_per_gpu"  # output tokens/s per GPU at the SLO: higher is better
    COST_PER_MTOK = "cost_per_mtok"  # $ per 1M output tokens at the SLO: lower is better
    TOKENS_PER_JOULE = "tokens_per_joule"  # output tokens per joule at the SLO: higher is better


class LengthsFigures(BaseModel):
    """What `workload.lengths_file` held, analysed by enginefoundry.spec.lengths
    (the code behind `enginefoundry lengths`).
    Filled when the spec is parsed and carried in a payload, so a worker without the file sees the same workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str  # as the spec gives it
    sha256: str
    count: Annotated[int, Field(ge=1)]
    mean: Annotated[float, Field(ge=0)]
    stddev: Annotated[float, Field(ge=0)]
    p50: int
    p99: int


class Workload(BaseModel):
    """ISL/OSL means and spread, the input side given either as numbers (`isl`, `isl_stddev`) or as a prompt-length
    file (`lengths_file`, the JSONL `enginefoundry lengths` reads): never both."""

    model_config = ConfigDict(extra="forbid")

    isl: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="mean input length (tokens); or give lengths_file")
    osl: Annotated[int, Field(ge=1, le=1_000_000)] = Field(description="mean output length (tokens)")
    isl_stddev: Annotated[int, Field(ge=0, description="standard deviation of the input length")] = 0
    osl_stddev: Annotated[int, Field(ge=0, description="standard deviation of the output length")] = 0
    lengths_file: str | None = Field(
        default=None, description='JSONL of {"tokens": N} records, relative to the spec: ISL mean and stddev from it')
    lengths: LengthsFigures | None = Field(default=None, description="filled from lengths_file; never by hand")

    @model_validator(mode="after")
    def _one_source(self) -> Workload:
        if self.lengths_file is None:
            if self.lengths is not None:
                raise ValueError("lengths is filled from lengths_file: remove it, or give lengths_file")
            if self.isl is None:
                raise ValueError("isl is required: give the mean input length (tokens), or lengths_file (a "
                                 "prompt-length file; docs/search.md)")
            return self
        if self.lengths is None:
            given = sorted({"isl", "isl_stddev"} & self.model_fields_set)
            if given:
                raise ValueError(f"lengths_file and {' and '.join(given)} exclude each other: keep the file (ISL "
                                 f"mean and stddev come from it) or the numbers, not both")
        elif (self.isl, self.isl_stddev) != figures_from(self.lengths):
            raise ValueError("isl/isl_stddev disagree with lengths (filled from lengths_file): remove all three "
                             "and keep lengths_file")
        return self

    @property
    def mean_isl(self) -> int:
        """`isl` once known: given, or filled from lengths_file when the spec is parsed (with_workload_lengths)."""
        if self.isl is None:
            raise SpecError([("search.workload.lengths_file", "not read yet: load the spec with load_spec or "
                                                              "parse_spec, which fill isl from it")])
        return self.isl

    def source(self) -> str:
        """Where the ISL came from, for `search` and `plan`."""
        if self.lengths is None:
            return "spec numbers"
        f = self.lengths
        return f"{f.file} ({f.count} prompts, p50 {f.p50}, p99 {f.p99}, sha256 {f.sha256[:12]})"


def figures_from(lengths: LengthsFigures) -> tuple[int, int]:
    """(isl, isl_stddev) from a prompt-length file's figures: the mean (at least 1) and the stddev, rounded."""
    return max(1, round(lengths.mean)), round(lengths.stddev)


class SearchSLO(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttft_p95_ms: Annotated[float, Field(gt=0)] = Field(description="time to first token, p95 (ms)")
    itl_p95_ms: Annotated[float, Field(gt=0)] = Field(description="inter-token latency (TPOT), p95 (ms)")
    e2e_p95_ms: Annotated[float, Field(gt=0)] | None = Field(default=None, description="request latency, p95 (ms)")


class GoodputSearch(BaseModel):
    """The measured side: bisect the concurrency for the highest load whose SLO percentiles hold, bounded."""

    model_config = ConfigDict(extra="forbid")

    min_concurrency: Annotated[int, Field(ge=1, description="lowest concurrency the bisection tries")] = 1
    max_concurrency: Annotated[int, Field(ge=1, le=100_000, description="highest concurrency it tries")] = 256
    max_points: Annotated[int, Field(ge=1, le=32, description="most benchmark points per unit")] = 6
    time_budget_s: Annotated[float, Field(gt=0, description="longest the search may measure one unit (s)")] = 900.0
    request_count: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="requests per point; default benchmark.request_count")

    @model_validator(mode="after")
    def _ordered(self) -> GoodputSearch:
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(f"min_concurrency ({self.min_concurrency}) must be ≤ max_concurrency "
                             f"({self.max_concurrency})")
        return self


class Prices(BaseModel):
    """$/GPU-hour by SKU (case-insensitive substring of a target's SKU) over the shipped table
    (enginefoundry/bench/costs.py);
    a `file` (YAML mapping SKU → $/GPU-hour) outranks the table, `gpu_hour` outranks both."""

    model_config = ConfigDict(extra="forbid")

    gpu_hour: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]] = Field(
        default_factory=dict, description="SKU substring → $/GPU-hour: finite, positive numbers (not `.inf`, not "
                                          "`true`)")
    file: str | None = Field(default=None, description="YAML mapping SKU → $/GPU-hour, relative to the spec")
    cpu_core_hour: Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)] = Field(
        default=0.04, description="$/core-hour for a cpu target (default: about an on-demand vCPU-hour)")
    cpu_cores: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="cores a cpu unit is charged for; default the worker's os.cpu_count()")

    @field_validator("gpu_hour")
    @classmethod
    def _named(cls, table: dict[str, float]) -> dict[str, float]:
        if any(not k.strip() for k in table):
            raise ValueError("an empty SKU name is a substring of every SKU: name the SKU (e.g. h100)")
        return table


class SearchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: Workload
    slo: SearchSLO = Field(description="the latency objectives a configuration must meet")
    objective: Objective = Field(default=Objective.TOKENS_PER_GPU, description="what the ranking maximises: "
                                 "output tokens per GPU, the lowest $/1M output tokens, or tokens per joule")
    precisions: list[Precision] = Field(default_factory=lambda: [Precision.BF16], min_length=1,
                                        description="precisions the predictor may choose")
    top_k: Annotated[int, Field(ge=1, le=16, description="configurations built and verified per target")] = 2
    gpu_budget: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        default=None, description="GPUs the predictor may spread replicas over; default each target's gpu_count")
    targets: list[str] | None = Field(default=None, description="targets searched (by name); default all")
    max_prediction_error: Annotated[float, Field(gt=0)] = Field(
        default=0.3, description="|measured − predicted| / predicted tokens/s/GPU beyond which a unit is flagged")
    goodput: GoodputSearch = Field(default_factory=GoodputSearch)
    prices: Prices = Field(default_factory=Prices)
    disaggregated: bool = Field(
        default=False, description="also search disaggregated serving (prefill and decode workers, the predictor's "
                                   "disagg mode), ranked beside the aggregated configurations")


class SearchedUnit(BaseModel):
    """What the search decided for one target: an ordinary variant and profile, and why (the prediction, or the
    reason it fell back to a measured search). Written by enginefoundry.search.plan, never by hand."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    variant: Variant
    profile: Profile
    rank: Annotated[int, Field(ge=1)]
    predicted: dict[str, float] | None = None  # tokens_per_s_gpu, tokens_per_s_user, ttft_ms, tpot_ms, concurrency
    predictor: str | None = None  # "aiconfigurator 0.12.0 h200_sxm trtllm 1.3.0rc20"
    pareto: list[tuple[float, float]] | None = None  # the predictor's front for its precision: (tok/s/user, tok/s/GPU)
    note: str = ""  # fallback reason or a toolchain disagreement
