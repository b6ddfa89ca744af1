"""Smoke (accuracy gate) and benchmark settings."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from enginefoundry.catalog.precisions import PRECISIONS, precisions_where


class LmEvalSpec(BaseModel):
    """An optional lm-eval task against the served endpoint (local-chat-completions), offline datasets."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(min_length=1)
    limit: int | None = Field(default=None, ge=1, description="examples per task; None runs them all")
    num_fewshot: int | None = Field(default=None, ge=0)
    include_path: str | None = Field(default=None, description="folder of task YAMLs with local datasets")
    datasets_cache: str | None = Field(default=None, description="a prepared HF_DATASETS_CACHE, used offline")
    num_concurrent: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=3600.0, gt=0)


class ReferenceSource(StrEnum):
    """What a unit is judged against: the Hugging Face source, or its higher-precision sibling unit's answers."""

    SOURCE = "source"
    SIBLING = "sibling"


UNIT_PRECISION: Final = "unit"  # smoke.reference_precision: the unit's own precision, where transformers computes it
# precisions transformers computes a reference in: the catalog's unquantized rows (a torch dtype), in its order
COMPUTABLE = tuple(p.value for p, row in PRECISIONS.items() if row.torch_dtype)
# smoke.reference_precision: simulated (and the `smoke` command's --reference-precision simulated): a weight-only
# quantized unit judged against the quantization tool's simulated model of the source
# (enginefoundry/smoke/simulated.py), computed in SIMULATED_DTYPE; every other unit as `unit`.
SIMULATED_REFERENCE: Final = "simulated"
SIMULATED_PRECISIONS = tuple(sorted(p.value for p in precisions_where(simulated=True)))  # the catalog's column
# The activations of a TensorRT-LLM weight-only build of a bf16 model: what plans count (2 bytes a parameter) and
# the simulation's dtype where the source's config names none. A simulation computes in its build's dtype (the
# source's 16-bit dtype, fp16 for an fp32 source: smoke.simulated.simulated_dtype).
SIMULATED_DTYPE: Final = "bf16"
BUILD_DTYPE_WORDS: Final = "the build's compute dtype (the source's 16-bit dtype; fp16 for an fp32 source)"
REFERENCE_PRECISIONS = (UNIT_PRECISION, SIMULATED_REFERENCE, *COMPUTABLE)
ReferencePrecision = Literal["unit", "simulated", "fp32", "bf16", "fp16"]


# Formats whose simulation does not depend on the calibration data: the engine lane's int8_wo and int4_wo are
# TensorRT-LLM's own weight-only quantizer, from each output channel's largest weight alone (smoke/simulated.py
# TRTLLM_WEIGHT_ONLY_BITS). The trtllm lane builds neither (the PyTorch backend has no W8A16, and int4_wo no ModelOpt
# unified export: lanes/trtllm.py). AWQ (int4_awq) searches its scales on the calibration data, and a lane
# calibrates on its own dataset (variant.calibration), so a simulation calibrated on the prompt set is another
# quantization: measured, SmolLM2-135M's int4_awq calibrated on other prompts is rejected against it (teacher-forced
# distance 0.30 against a limit of 0.063; docs/smoke-gate.md 'AWQ calibrated elsewhere'). Where the lane exports
# ModelOpt's unified checkpoint (Lane.dequantizable), `simulated` judges int4_awq against that checkpoint, dequantized
# (planning.preflight.dequantizes).
# TensorRT-LLM's own weight-only precisions (the catalog's `weight_only_precision` column).
CALIBRATION_FREE = tuple(sorted(p.value for p, row in PRECISIONS.items() if row.weight_only_precision))


# What a unit of a precision with no reference at its own precision gets (smoke.no_like_reference): `fallback` judges it
# against the fp32 source, with bounds derived from a measured quantization spread (smoke/fallback.py); `refuse`
# refuses the spec at plan and validate (issue 39).
NO_LIKE_REFERENCE = ("fallback", "refuse")
# The log-prob rules (smoke.logprob_checks): judged where the endpoint returns log-probs, named as not run where it
# does not (`when-served`); or required: refused at plan for a lane whose smoke server cannot return them, and a
# rule that could not run fails the verdict (`required`).
LOGPROB_CHECKS = ("when-served", "required")
# Formats with no like-with-like reference: the fp32 source judges them with bounds derived from the spread of the
# source's weights rounded to the format (smoke/fallback.py PROXIES): fp8 and nvfp4 quantize activations, which no
# plain checkpoint carries; int4_awq's scales are searched on the lane's own calibration data.
FALLBACK_WORDS: Final = ("the fp32 source, with bounds derived from the spread measured on the source's weights "
                         "rounded to {precision} (where the endpoint returns log-probs; else the family's table): a "
                         "weaker reference")


def simulates(setting: str, precision: str) -> bool:
    """A unit of `precision` is judged against the quantization tool's simulated model under `setting`: `unit` (the
    default) and `simulated` cover the formats whose quantization the prompt set does not change (like with like
    by default: issue 39)."""
    return setting in (UNIT_PRECISION, SIMULATED_REFERENCE) and precision in CALIBRATION_FREE


def simulated_why(precision: str) -> str:
    """Why a unit is judged against its simulation (the `smoke` command's --reference-precision simulated names any
    of SIMULATED_PRECISIONS; a calibrated format is like with like only for a build calibrated on the same prompts)."""
    why = (f"the quantization tool's simulated {precision} model of the source, computed in {BUILD_DTYPE_WORDS} (like "
           "with like; the policy of that dtype)")
    if precision not in CALIBRATION_FREE:
        why += "; calibrated on the judged prompts: like with like for a build calibrated on them"
    return why


def reference_precision_for(setting: str, precision: str) -> tuple[str, str]:
    """The dtype of a unit's source reference and why: `unit` judges like with like (a bf16 unit against a bf16
    reference); a precision transformers cannot compute (int8_wo, fp8, int4) is judged against fp32 (or, with
    smoke.reference: sibling, against the gated higher-precision sibling); `simulated` judges an int8_wo or int4_wo
    unit against the quantization tool's simulated model in SIMULATED_DTYPE, any other as `unit`."""
    if simulates(setting, precision):
        return SIMULATED_DTYPE, simulated_why(precision)
    if setting == SIMULATED_REFERENCE:
        setting = UNIT_PRECISION
    if setting != UNIT_PRECISION:
        like = " (like with like)" if setting == precision else ""
        return setting, f"reference precision {setting} as configured{like}"
    if precision in COMPUTABLE:
        return precision, f"the unit's own precision {precision} (like with like)"
    return "fp32", f"{no_like_reference(precision)}: {FALLBACK_WORDS.format(precision=precision)}"


def no_like_reference(precision: str) -> str:
    """Why a unit of `precision` has no reference at its own precision (lane trtllm's int4_awq, fp8 and nvfp4 have
    one: its own exported checkpoint, dequantized; planning.preflight.dequantizes)."""
    if precision in SIMULATED_PRECISIONS:
        return (f"no {precision} reference of this lane's build: its scales are searched on the lane's own "
                "calibration data (variant.calibration), which a simulation here does not have (lane trtllm: its "
                "exported checkpoint, dequantized)")
    return (f"no {precision} reference of this lane's build: {precision} quantizes activations, which only a "
            "lane that exports its quantized checkpoint gives the gate (lane trtllm, without a quantized KV cache), "
            "or a gated sibling (smoke.reference: sibling)")


class ReferenceDevice(StrEnum):
    """Where a source reference is computed: the host CPU, or the unit's GPUs (device_map="auto")."""

    CPU = "cpu"
    GPU = "gpu"


class SmokeSpec(BaseModel):
    """The smoke gate. Unset numbers take the unit's precision-family defaults (enginefoundry/smoke/policy.py,
    table in docs/smoke-gate.md); a number set here overrides the default for every family."""

    model_config = ConfigDict(extra="forbid")

    prompts: str = Field(description="JSONL prompt set; relative paths are taken from the spec's folder")
    reference_precision: ReferencePrecision = Field(
        default=UNIT_PRECISION, description="the source reference's dtype: unit (each unit like with like where "
        "a reference of its precision exists: fp32, bf16, fp16 computed by transformers, int8_wo and int4_wo "
        "against TensorRT-LLM's weight-only quantization of the source simulated in the build's dtype, lane "
        "trtllm's int4_awq, fp8 and nvfp4 against its own exported checkpoint dequantized (fp8, nvfp4: inputs "
        "quantized as the engine's); log-prob bounds from the spread measured "
        "there; fp32 for the others, see no_like_reference), simulated (the same; kept for specs that name it), or one "
        "dtype for every unit: fp32, bf16, fp16")
    no_like_reference: Literal["fallback", "refuse"] = Field(
        default="fallback", description="a unit whose precision has no like-with-like reference (fp8, nvfp4; "
        "int4_awq but on lane trtllm): fallback (judged against the fp32 source, bounds derived from the spread of "
        "the source's weights rounded to its format, and the verdict says so) or refuse (plan and validate refuse "
        "the spec)")
    logprob_checks: Literal["when-served", "required"] = Field(
        default="when-served", description="the log-prob rules (log-prob distance, teacher-forced log-probs): "
        "when-served (judged where the endpoint returns log-probs, else named as not run in the verdict) or "
        "required (plan refuses a lane whose smoke server cannot return them; a rule that could not run fails)")
    max_new_tokens: Annotated[int, Field(ge=1, le=4096, description="tokens generated per prompt")] = 16
    accuracy_margin: Annotated[float, Field(gt=0.0, lt=1.0)] | None = Field(
        default=None, description="non-inferiority margin δ on task accuracy (paired against the reference)")
    alpha: Annotated[float, Field(gt=0.0, lt=0.5)] | None = Field(
        default=None, description="significance level α of the non-inferiority test; unset: the family's")
    power: Annotated[float, Field(ge=0.5, lt=1.0)] | None = Field(
        default=None, description="power the minimum prompt count is derived for; unset: the family's")
    expected_discordance: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        default=None, description="expected share ψ of prompts the unit and the reference disagree on (for the "
        "minimum prompt count); unset: the family's")
    first_n_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="N of the first-N-tokens agreement rule; unset: the family's")
    min_first_n_agreement: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="lower bound the first-N agreement must reach; unset: the family's")
    min_prefix_share: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="least mean share of the answer's common prefix; unset: the family's")
    max_degenerate_share: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="most answers allowed to be degenerate (repetition, empty); unset: the "
        "family's")
    small_sample: Literal["refuse", "warn"] = Field(
        default="refuse", description="a prompt set smaller than the derived minimum: refuse (fail) or warn")
    min_agreement: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="optional floor on full-answer agreement (Wilson lower bound); off by default "
        "because reduced precision drifts late in answers")
    confidence: Annotated[float, Field(gt=0.5, lt=1.0, description="confidence of the gate's intervals")] = 0.95
    concurrency: Annotated[int, Field(ge=1, le=256)] = Field(
        default=8, description="requests in flight against the endpoint during the smoke test (a batching "
        "server answers them together; 1 asks one prompt at a time)")
    max_logprob_diff: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="limit on the mean |Δ log-prob| per token against the reference; judged only "
        "where the endpoint returns log-probs")
    reference_host_memory_gib: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="host RAM the reference may use; preflight refuses a reference that needs more")
    reference: ReferenceSource = Field(
        default=ReferenceSource.SOURCE, description="source: the Hugging Face source (computed in "
        "reference_precision on reference_device); sibling: units of lower precision than reference_sibling are "
        "judged against the served answers of their reference_sibling unit (same target and profile)")
    reference_sibling: str | None = Field(
        default=None, description="with reference: sibling, the variant whose served answers judge the "
        "lower-precision units: a variant name (bf16-tp1) or a precision that names one variant (bf16)")
    reference_device: ReferenceDevice = Field(
        default=ReferenceDevice.CPU, description="where the source reference runs: cpu (host RAM) or gpu (the "
        "unit's GPUs on its worker, the model sharded with device_map=auto)")
    lm_eval: LmEvalSpec | None = None

    @field_validator("reference_precision", mode="before")
    @classmethod
    def _known_reference_precision(cls, value: object) -> object:
        if value not in REFERENCE_PRECISIONS:
            raise ValueError(f"{value!r} is not a reference precision: use unit (each unit judged against a "
                             "reference of its own precision where transformers computes one, fp32 otherwise), "
                             f"simulated (as unit, and {', '.join(CALIBRATION_FREE)} units against the "
                             "quantization tool's simulated model) or one dtype for every unit: "
                             f"{', '.join(COMPUTABLE)} (smoke.reference: sibling judges a quantized unit against a "
                             "sibling unit)")
        return value

    def reference_for(self, precision: str) -> tuple[str, str]:
        """The dtype of the source reference a unit of `precision` is judged against, and why."""
        return reference_precision_for(self.reference_precision, precision)

    def simulates(self, precision: str) -> bool:
        """A unit of `precision` is judged against the quantization tool's simulated model of the source."""
        return simulates(self.reference_precision, precision)

    def has_like_reference(self, precision: str, dequantizable: frozenset[str] = frozenset()) -> bool:
        """A unit of `precision` is judged against a reference at its own precision (`dequantizable`: the
        precisions whose lane checkpoint is dequantized into its reference, Lane.dequantizable)."""
        if self.reference is ReferenceSource.SIBLING:
            return False
        own = self.reference_for(precision)[0] == precision and precision in COMPUTABLE
        exported = self.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE) and precision in dequantizable
        return own or self.simulates(precision) or exported

    def like_with_like(self, precision: str) -> bool:
        """A unit judged against a source reference of its own precision (or its quantization's simulation), its
        log-prob bounds from the spread measured there (a second pass over the reference's weights in wider
        arithmetic)."""
        own = self.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE) and precision in COMPUTABLE
        return own or self.simulates(precision)

    @model_validator(mode="after")
    def _sibling_named(self) -> SmokeSpec:
        if self.reference is ReferenceSource.SIBLING and not self.reference_sibling:
            raise ValueError("smoke.reference: sibling needs smoke.reference_sibling, the variant whose served "
                             "answers judge the lower-precision units (e.g. reference_sibling: bf16)")
        if self.reference is ReferenceSource.SIBLING and self.reference_precision == SIMULATED_REFERENCE:
            raise ValueError("smoke.reference: sibling and smoke.reference_precision: simulated both choose what a "
                             "quantized unit is judged against: keep one (simulated: the quantization tool's "
                             "simulated model; sibling: the higher-precision sibling's served answers)")
        if self.reference_sibling and self.reference is not ReferenceSource.SIBLING:
            raise ValueError("smoke.reference_sibling is set but smoke.reference is source: set reference: sibling, "
                             "or remove reference_sibling")
        return self

    def policy_overrides(self) -> dict[str, float | int | None]:
        return {k: getattr(self, k) for k in (
            "accuracy_margin", "alpha", "power", "expected_discordance", "first_n_tokens", "min_first_n_agreement",
            "min_prefix_share", "max_degenerate_share", "max_logprob_diff")}


class BenchTool(StrEnum):
    AIPERF = "aiperf"
    GENAI_PERF = "genai-perf"


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64, description="scenario name")]
    input_tokens_mean: Annotated[int, Field(ge=1, description="mean prompt length (tokens)")]
    input_tokens_stddev: Annotated[int, Field(ge=0, description="its standard deviation")] = 0
    output_tokens_mean: Annotated[int, Field(ge=1, description="mean output length (tokens)")]
    output_tokens_stddev: Annotated[int, Field(ge=0, description="its standard deviation")] = 0


class SLOs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttft_p95_ms: Annotated[float, Field(gt=0)] | None = Field(default=None,
                                                              description="time to first token, p95 (ms)")
    itl_p95_ms: Annotated[float, Field(gt=0)] | None = Field(default=None,
                                                             description="inter-token latency, p95 (ms)")


# One client host holds at most this many connections to one server address and port: Linux's default ephemeral
# port range, net.ipv4.ip_local_port_range 32768–60999 (Documentation/networking/ip-sysctl.rst). A concurrency above
# it cannot run (10^9 validated and then failed at the benchmark, issue 34).
MAX_CONCURRENCY = 60999 - 32768 + 1


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="false: no benchmark stage")
    on_rejected: bool = Field(default=False, description="benchmark a unit its smoke gate rejected too (to diagnose "
                                                         "it); default: a rejected unit is not benchmarked")
    tool: BenchTool = Field(default=BenchTool.AIPERF, description="the load generator")
    scenarios: list[Scenario] = Field(min_length=1, description="input/output length mixes; each one runs at "
                                      "every concurrency")
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description=f"requests in flight, one point each (at most {MAX_CONCURRENCY}: one client "
        "host's connections to one server)")
    request_count: Annotated[int, Field(ge=1, description="requests per point; at least the largest "
                                                          "concurrency")] = 64
    warmup_request_count: Annotated[int, Field(ge=0, description="requests before each measured point")] = 4
    seed: int = Field(default=42, description="the load generator's random seed")
    timeout_s: Annotated[float, Field(gt=0, description="longest a benchmark point may take (s)")] = 600.0
    slo: SLOs = Field(default_factory=SLOs, description="latency objectives the sweep reports goodput against")
    baseline_endpoints: list[str] = Field(default_factory=list, description="other OpenAI-compatible endpoints "
                                          "benchmarked alongside, for comparison")
    # Extra request fields for every benchmark request, e.g. {"ignore_eos": "true"} on TensorRT-LLM servers for
    # fair output-length accounting (transformers serve rejects unknown fields).
    extra_inputs: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sorted_unique_concurrency(self) -> BenchmarkSpec:
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError(f"concurrency has duplicates: {self.concurrency}")
        self.concurrency = sorted(self.concurrency)
        if self.concurrency[-1] > MAX_CONCURRENCY:
            raise ValueError(f"concurrency {self.concurrency[-1]} is more connections than one client host opens to "
                             f"one server (Linux's default ephemeral port range holds {MAX_CONCURRENCY}): it cannot "
                             "run; give concurrencies the server can hold (e.g. up to its max_batch_size × a few)")
        if self.enabled and self.request_count < self.concurrency[-1]:
            top = self.concurrency[-1]
            raise ValueError(f"request_count ({self.request_count}) is smaller than the largest concurrency ({top}): "
                             f"that point would never hold {top} requests in flight, and its figures would be "
                             f"reported at a load it never ran; set request_count to at least {top} (a few times "
                             "it, for stable percentiles)")
        return self
