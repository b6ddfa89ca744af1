"""The unit manifest: what a published build is, how it was made, and every file with its size and sha256.

A build without a manifest does not exist to readers; the manifest is written last, once, and never changed
(`manifests/<model>/<key>/<build-id>.json`). File paths are relative POSIX paths confined to the unit folder;
anything else is refused when the manifest is parsed. Its parts are typed (`WirePart`) and written back byte for
byte as read: tests/unit/test_manifest_wire.py holds manifests published before they were typed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, field_validator

from enginefoundry.confine import relative_posix
from enginefoundry.identity import sha256_json
from enginefoundry.schemas.base import Document, Number, WirePart
from enginefoundry.schemas.loose import JsonObject, JsonSchemaDocument
from enginefoundry.schemas.unit_status import UnitStatus

# 2: content-addressed layout (build_id, FileEntry.executable). Version 1 manifests (artifacts/<model>/<key>/
# manifest.json) are still read.
MANIFEST_SCHEMA_VERSION = 2
SHA256_HEX = r"^[0-9a-f]{64}$"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="relative POSIX path inside the unit: no '..', no absolute, no backslash")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_HEX, description="the file's content digest; also its blob name")
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _confined(cls, path: str) -> str:
        relative_posix(path, "files[].path")
        reason = _path_refusal(path)
        if reason:
            raise ValueError(f"files[].path {reason}: {_shown(path)}")
        return path


# What a manifest path may not hold beyond `store.relative_posix`'s rules, checked before anything is written:
# C0/C1 control characters and Unicode bidirectional overrides (a newline or a terminal escape shown or written
# literally), VCS folders (a `.git/hooks/…` file runs on the next git command there: git's `verify_path`,
# read-cache.c, refuses `.git` components for the same reason), and depths and lengths no unit has (a 1000-level
# path made `Path.mkdir(parents=True)` recurse past Python's limit).
_DISPLAY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})
MAX_PATH_DEPTH = 64
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux filesystems
MAX_PATH_BYTES = 4000  # below PATH_MAX (4096) with room for the destination folder


def _path_refusal(path: str) -> str | None:
    parts = path.split("/")
    if _DISPLAY_CONTROL.search(path):
        return "contains a control character or a bidirectional override"
    if any(p.lower() in _VCS_FOLDERS for p in parts):
        return "is inside a version-control folder (.git, .hg, .svn)"
    if len(parts) > MAX_PATH_DEPTH:
        return f"has {len(parts)} components (at most {MAX_PATH_DEPTH})"
    if len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_COMPONENT_BYTES for p in parts):
        return f"is longer than {MAX_PATH_BYTES} bytes or has a component longer than {MAX_COMPONENT_BYTES}"
    return None


def _shown(path: str) -> str:
    """A hostile path in a one-line message: escaped (repr), at most 100 characters of it."""
    return repr(path[:100]) + ("…" if len(path) > 100 else "")


def file_list_problems(files: list[FileEntry]) -> list[str]:
    """A build's file list as a folder tree: no path twice, no path that is both a file and a folder
    (`a` and `a/b`). Empty when the list can be written as it is."""
    problems, seen = [], set()
    for entry in files:
        if entry.path in seen:
            problems.append(f"{_shown(entry.path)} is listed twice")
        seen.add(entry.path)
    folders = {"/".join(e.path.split("/")[:i]) for e in files for i in range(1, e.path.count("/") + 1)}
    problems += [f"{_shown(p)} is both a file and a folder" for p in sorted(seen & folders)]
    return problems


class InputFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str = Field(pattern=SHA256_HEX)


INPUT_KINDS = ("converted-checkpoint", "reference", "sibling-reference", "spread", "simulation")
InputKind = Literal["converted-checkpoint", "reference", "sibling-reference", "spread", "simulation"]


class BuildInput(BaseModel):
    """Something a build consumed besides its named sources: a converted checkpoint, reference answers (the source's,
    a simulation's or a sibling unit's), their measured spread, a simulated model. Bound by digest in the manifest,
    which the build's signed statements cover: a signature names exactly the bytes the build was made and judged
    with, and how it came by them."""

    model_config = ConfigDict(extra="forbid")

    kind: InputKind
    key: str = Field(description="its cache key (a converted checkpoint's key, a reference's key digest, …)")
    uri: str = Field(default="", description="where it is: its manifest or document in the store, or a local folder")
    sha256: str = Field(pattern=SHA256_HEX, description="of its manifest's bytes (a converted checkpoint), its "
                        "document's bytes (answers, a spread) or its weights (a simulated model)")
    origin: Literal["computed", "store", "local cache"] = Field(
        description="computed: derived from the named sources in this run; store or local cache: reused")
    proven_by: str = Field(default="", description="a reused input of a signed build: the trusted signer whose "
                           "signature over `sha256` was checked before the build used it")
    files: list[InputFile] = Field(default_factory=list, description="a converted checkpoint's files")



# The manifest's parts. Each is a `WirePart`: typed fields, and written back exactly as read (older manifests
# lack some keys and order others differently; their bytes are signed). Field order below is the order today's
# writer (records/outcomes.py `unit_manifest`, inputs/units.py `unit_key_components`) gives them.


class ToolchainIdentity(WirePart):
    """The toolchain part of a key (inputs/units.py `toolchain_identity`): the spec's pins and the versions the lane
    reports."""

    lane: str = ""
    trtllm_version: str | None = None
    image: str | None = None
    image_digest: str | None = None
    versions: dict[str, str] | None = Field(default=None, description="what the lane reports; None (a run's own "
                                            "identity only): this host has no toolchain to ask")


class TargetIdentity(WirePart):
    """The target part of a unit key (inputs/units.py `target_identity`)."""

    arch: str = ""
    sku: list[str] = Field(default_factory=list)
    gpu_count: int = 1


class Calibration(WirePart):
    """A variant's calibration set (spec `CalibrationSpec`)."""

    dataset: str = ""
    samples: int = 0
    max_seq_length: int = 0


class VariantPart(WirePart):
    """A unit's variant (spec `Variant`); in a key without its target list and without unset MoE fields."""

    precision: str = ""
    tp: int = 1
    pp: int = 1
    moe_ep: int = 1
    moe_tp: int | None = None
    attention_dp: bool = False
    kv_cache_dtype: str = ""
    calibration: Calibration | None = None
    targets: list[str] | None = None


class ProfilePart(WirePart):
    """A unit's serving profile (spec `Profile`)."""

    name: str = ""
    max_batch_size: int = 0
    max_input_len: int = 0
    max_seq_len: int = 0
    max_num_tokens: int = 0
    kv_cache_free_gpu_memory_fraction: Number = 0.0
    paged_kv_cache: bool = True
    remove_input_padding: bool = True


class AdapterKey(WirePart):
    """The adapter part of a key: one adapter's unit (name, mode, digest) or, mode serve, every adapter's digest."""

    name: str | None = None
    mode: str = ""
    weights_digest: str | None = None
    served: dict[str, str] | None = None


class SourceQuantization(WirePart):
    """A pre-quantized source's own quantization (inputs/quantized_source.py), as keys and manifests record it."""

    file: str = ""
    producer: str = ""
    quant_algo: str | None = None
    precision: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None


class SpeculativeKey(WirePart):
    """A speculative unit's section as its key hashes it (spec `SpeculativeSpec.keyed`), with the draft's digests."""

    algorithm: str = ""
    max_draft_len: int | None = None
    num_nextn_predict_layers: int | None = None
    max_matching_ngram_size: int | None = None
    one_model: bool | None = None
    draft_weights_digest: str | None = None
    draft_tokenizer_digest: str | None = None


LaneOptionValue: TypeAlias = str | int | float | bool | list[str] | None
"""One lane option's value as a spec sets it (spec/lane_options.py: flags, counts, fractions, names)."""


class KeyComponents(WirePart):
    """A key's components: what the key is the hash of (inputs/units.py `key_of`), recorded in the manifest as
    hashed. Made by `unit_key_components` / `checkpoint_key_components`; a worker and `explain` read it typed."""

    format_version: int = 0
    kind: str = ""
    weights_digest: str = ""
    tokenizer_digest: str = ""
    lane: str = ""
    toolchain: ToolchainIdentity | None = None
    variant: VariantPart | None = None
    calibration: Calibration | None = None
    profile: ProfilePart | None = None
    target: TargetIdentity | None = None
    lane_options: dict[str, LaneOptionValue] | None = None
    speculative: SpeculativeKey | None = None
    adapter: AdapterKey | None = None
    source_quantization: SourceQuantization | None = None

    MADE: ClassVar[tuple[str, ...]] = ("format_version", "kind", "weights_digest", "tokenizer_digest", "lane",
                                       "toolchain", "variant", "calibration")
    """What `unit_key_components` and `checkpoint_key_components` always make. A manifest may lack them (a store
    test's hand-made one); a worker that builds from components refuses those that do (`missing`)."""

    @classmethod
    def of(cls, components: Mapping[str, object]) -> KeyComponents:
        """Components as made (a dict) or as recorded (a manifest's JSON)."""
        return cls.model_validate(components)

    def missing(self) -> list[str]:
        """The components every made key has and these lack (empty for components a build made)."""
        return [name for name in self.MADE if name not in self.model_fields_set]

    def as_json(self) -> dict[str, Any]:  # JSON edge: the form keys hash and manifests record
        return self.model_dump(mode="json")

    @property
    def key(self) -> str:
        return sha256_json(self.as_json())


class TargetPart(WirePart):
    """A unit's target (spec `Target`)."""

    name: str = ""
    arch: str = ""
    sku: list[str] = Field(default_factory=list)
    gpu_count: int = 1
    memory_gib: Number | None = None
    work_pool: str | None = None


class SourceIdentityPart(WirePart):
    """What a source is beyond its URI: each file's sha256, S3 versions/ETags or a commit; a model with adapters adds
    the base's digest and each adapter's source."""

    sha256: dict[str, str] | None = None
    objects: dict[str, str] | None = Field(default=None, description="s3: relative key → version id or ETag")
    bucket: str | None = None
    prefix: str | None = None
    repo: str | None = None
    requested_revision: str | None = None
    commit_sha: str | None = None
    endpoint: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None
    base_weights_digest: str | None = None
    adapter: SourcePart | None = None
    adapters: list[SourcePart] | None = None


class SourcePart(WirePart):
    """The checkpoint a unit was built from (inputs/sources.py `SourceSnapshot` without its local folder)."""

    name: str | None = None
    uri: str = ""
    kind: str = ""
    revision: str | None = None
    requested_revision: str | None = None
    identity: SourceIdentityPart | None = None
    weights_digest: str = ""
    tokenizer_digest: str = ""
    quantization: SourceQuantization | None = None


class DevicePart(WirePart):
    """What the unit was built on (lanes' `device_info`)."""

    hostname_hash: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    python: str | None = None
    device: str | None = None
    torch: str | None = None


class BuildParams(WirePart):
    """The parameters a lane built with. The reference lane's are below; an engine lane adds its own build
    configuration (TensorRT-LLM's), kept as written."""

    device: str | None = None
    dtype: str | None = None
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    adapters: list[str] | None = None


class SmokePart(WirePart):
    """The smoke gate's summary (smoke `SmokeReport.summary`): agreement with the reference and the checks run."""

    smoke_n: int | None = None
    smoke_agreement: Number | None = None
    smoke_agreement_lower_bound: Number | None = None
    smoke_first_n_agreement: Number | None = None
    smoke_prefix_share: Number | None = None
    smoke_passed: bool | None = None
    smoke_min_samples: int | None = None
    smoke_tokenizer_match: bool | None = None
    smoke_accuracy: Number | None = None
    smoke_reference_accuracy: Number | None = None
    smoke_tf_logprob_mean_abs_diff: Number | None = None
    smoke_tf_top1_agreement: Number | None = None
    smoke_logprob_mean_abs_diff: Number | None = None
    smoke_logprob_max_abs_diff: Number | None = None
    smoke_checks_not_run: int | None = None
    samples: int | None = None

    def figure(self, name: str) -> float | None:
        """A numeric figure by its summary name (`smoke_agreement`, …); None when absent or not a number."""
        value = getattr(self, name, None)
        if value is None:
            value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class BenchPointPart(WirePart):
    """One benchmark point (bench `BenchPoint.metrics` with its scenario and concurrency)."""

    scenario: str = ""
    concurrency: int = 0
    valid: Number | None = None
    completed: int | None = None
    error_rate: Number | None = None
    requests_per_s: Number | None = None
    output_tokens_per_s: Number | None = None
    output_tps: Number | None = None
    ttft_ms_p50: Number | None = None
    ttft_ms_p95: Number | None = None
    ttft_ms_p99: Number | None = None
    itl_ms_p50: Number | None = None
    itl_ms_p95: Number | None = None
    itl_ms_p99: Number | None = None
    latency_ms_p50: Number | None = None
    latency_ms_p95: Number | None = None
    latency_ms_p99: Number | None = None
    trials: list[dict[str, Number | None]] | None = Field(
        default=None, description="each repeated trial's figures, when the build repeated the point")

    def figure(self, name: str) -> float | None:
        value = getattr(self, name, None)
        if value is None:
            value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class SloResultPart(WirePart):
    """One scenario's best point within its SLO (bench `SLOResult`)."""

    scenario: str = ""
    best_concurrency: int | None = None
    output_tokens_per_s: Number | None = None
    detail: str = ""


class ServingCost(WirePart):
    """What serving costs at the measured goodput (search/cost.py): dollars per hour and per million tokens."""

    usd_per_hour: Number | None = None
    usd_per_mtok: Number | None = None
    price_source: str | None = None
    energy: str | None = None
    why: str | None = None
    tokens_per_joule: Number | str | None = None
    avg_watts_per_gpu: Number | str | None = None


class ProbePart(WirePart):
    """One concurrency the goodput search measured (bench `Probe`)."""

    concurrency: int = 0
    met: bool = False
    seconds: Number | None = None
    tokens_per_s_gpu: Number | None = None
    tokens_per_s_user: Number | None = None
    output_tokens_per_s: Number | None = None
    ttft_p95_ms: Number | None = None
    itl_p95_ms: Number | None = None
    energy_j: Number | None = None


class SearchPart(WirePart):
    """Goodput at the SLO, predicted beside measured, cost and energy (bench `SearchVerdict`)."""

    goodput_concurrency: int | None = None
    slo: dict[str, Number | None] = Field(default_factory=dict)
    bounded_by: str = ""
    probes: list[ProbePart] = Field(default_factory=list)
    predicted: dict[str, Number] = Field(default_factory=dict)
    measured: dict[str, Number] = Field(default_factory=dict)
    prediction_error: Number | None = None
    error_bound: Number | None = None
    flagged: bool = False
    cost: ServingCost = Field(default_factory=ServingCost)
    note: str = ""
    per: str = "GPU"


class BenchPart(WirePart):
    """The benchmark's summary (records/outcomes.py `bench_summary`): its points, SLO results and the search."""

    tool: str | None = None
    tool_version: str | None = None
    bench_points: int | None = None
    bench_valid: Number | None = None
    bench_best_output_tokens_per_s: Number | None = None
    points: list[BenchPointPart] = Field(default_factory=list)
    slo: list[SloResultPart] = Field(default_factory=list)
    search: SearchPart | None = None

    def usd_per_mtok(self) -> float | None:
        """The measured serving cost per million output tokens; None without a search or a price."""
        cost = self.search.cost.usd_per_mtok if self.search is not None else None
        return float(cost) if cost is not None else None


class LmEvalSettings(WirePart):
    """The lm-eval task check a gate ran (spec `LmEvalSpec`)."""

    tasks: list[str] = Field(default_factory=list)
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: str | None = None
    datasets_cache: str | None = None
    num_concurrent: int = 1
    timeout_s: Number = 3600.0


class GateSettings(WirePart):
    """The smoke gate's settings the unit was judged by (spec `SmokeSpec`)."""

    prompts: str = ""
    reference_precision: str | None = None
    no_like_reference: str | None = None
    logprob_checks: str | None = None
    max_new_tokens: int | None = None
    accuracy_margin: Number | None = None
    alpha: Number | None = None
    power: Number | None = None
    expected_discordance: Number | None = None
    first_n_tokens: int | None = None
    min_first_n_agreement: Number | None = None
    min_prefix_share: Number | None = None
    max_degenerate_share: Number | None = None
    small_sample: str | None = None
    min_agreement: Number | None = None
    confidence: Number | None = None
    concurrency: int | None = None
    max_logprob_diff: Number | None = None
    reference_host_memory_gib: Number | None = None
    reference: str | None = None
    reference_sibling: str | None = None
    reference_device: str | None = None
    lm_eval: LmEvalSettings | None = None


class Manifest(Document):
    """A published enginefoundry unit: its cache key and every key component, source identity, tool versions, the
    device it was built on, build parameters, each file with size and sha256, smoke and benchmark summaries, status,
    and the MLflow/Prefect runs that produced it."""

    SCHEMA_NAME: ClassVar[str] = "manifest"
    SCHEMA_VERSION: ClassVar[int] = MANIFEST_SCHEMA_VERSION
    MAX_BYTES: ClassVar[int] = 64 << 20


    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    key: str
    build_id: str | None = Field(default=None, description="this build of the key (None: a version 1 manifest)")
    key_components: KeyComponents
    checkpoint_key: str | None = None
    checkpoint_uri: str | None = None
    model: str
    unit: str
    lane: str
    target: TargetPart
    variant: VariantPart
    profile: ProfilePart
    source: SourcePart = Field(description="uri, kind, resolved revision, identity, digests")
    versions: dict[str, str] = Field(default_factory=dict)
    device: DevicePart = Field(default_factory=DevicePart, description="what the unit was built on")
    build_params: BuildParams = Field(default_factory=BuildParams)
    files: list[FileEntry]
    smoke: SmokePart = Field(default_factory=SmokePart)
    benchmark: BenchPart = Field(default_factory=BenchPart)
    prompts_digest: str | None = Field(default=None, description="sha256 of the smoke prompt set that gated the unit")
    gate: GateSettings = Field(default_factory=GateSettings,
                               description="the smoke gate settings the unit was judged by")
    inputs: list[BuildInput] = Field(default_factory=list, description="what the build consumed besides its named "
                                     "sources, each bound by digest (evidence/inputs.py)")
    status: Literal[UnitStatus.CANDIDATE, UnitStatus.REJECTED] = Field(
        description="candidate | rejected (a failed unit is never published)")
    status_reason: str = ""
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @field_validator("files")
    @classmethod
    def _a_tree(cls, files: list[FileEntry]) -> list[FileEntry]:
        problems = file_list_problems(files)
        if problems:
            raise ValueError("files: " + "; ".join(problems[:5]))
        return files

    def to_json(self) -> bytes:
        """Serialized and checked against the committed JSON Schema: a manifest that readers in other
        languages could not trust is never written."""
        data = self.model_dump(mode="json")
        validate_against_schema(data)
        return (json.dumps(data, indent=2) + "\n").encode()


SCHEMA_PATH = Path(__file__).resolve().parent / "manifest.schema.json"


@cache
def _validator() -> Any:  # JSON edge: a jsonschema validator (the package has no type information)
    import jsonschema

    schema: JsonSchemaDocument = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def validate_against_schema(data: JsonObject) -> None:
    """A manifest's JSON form against the committed schema (readers in other languages use that copy); raises
    jsonschema's ValidationError. The validator is made once: checking the schema itself on every call cost more
    than writing the manifest."""
    _validator().validate(data)
