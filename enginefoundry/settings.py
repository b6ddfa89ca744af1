"""Every knob the environment can set, in one settings object (pydantic-settings), and where each
effective destination came from.

Precedence for the three destinations (the MLflow tracking URI, the artifact store, the S3 endpoint), as in
the tools this pipeline drives: command-line flag (or flow parameter) > environment variable > spec field >
default. The environment variables are the ecosystem's own where one exists: `MLFLOW_TRACKING_URI` (MLflow),
`AWS_ENDPOINT_URL_S3` (boto3's service-specific endpoint); `EF_S3_ENDPOINT` is still read as a deprecated
alias of the latter.

Relative paths: a relative `file://` store or `sqlite:///` MLflow database written in a spec (or left at its
default) resolves against the spec's folder, like every input path of the spec; one given by a flag or an
environment variable resolves against the working directory, as a shell user expects. Either way the
effective value is absolute, so a flow or a worker that runs elsewhere writes to the same place.

The table in docs/configuration.md lists `ENV_TABLE`; tests/unit/test_settings.py keeps the two equal.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from enginefoundry.catalog.schemes import SchemeKind, scheme_of
from enginefoundry.spec import BuildSpec

DEPRECATED_S3_ENV = "EF_S3_ENDPOINT"


class EnvSettings(BaseSettings):
    """What the environment sets. Read where it is used (`EnvSettings.read()`): tests and workers change it."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, case_sensitive=True, frozen=True)

    @classmethod
    def read(cls) -> EnvSettings:
        """The settings of the environment as it is now, parsed once per distinct environment: a parse costs ~3 ms
        (pydantic-settings inspects every field's annotation), and `plan` asks for them per unit and lane check
        (4,272 parses, 12 of test_plan_matrix_per_release's 22 s on the 1.0 registry)."""
        return _parsed_environment(tuple(sorted(os.environ.items())))

    mlflow_tracking_uri: str | None = Field(
        default=None, validation_alias="MLFLOW_TRACKING_URI",
        description="MLflow tracking URI; overrides the spec's tracking.mlflow_uri (--mlflow-uri overrides it)")
    store: str | None = Field(
        default=None, validation_alias="EF_STORE",
        description="artifact store (s3://bucket/prefix or file://path); overrides publish.store (--store "
                    "overrides it)")
    s3_endpoint_url: str | None = Field(
        default=None, validation_alias="AWS_ENDPOINT_URL_S3",
        description="S3 endpoint (SeaweedFS, MinIO; boto3's own variable); overrides publish.s3_endpoint_url "
                    "(--s3-endpoint-url overrides it)")
    deprecated_s3_endpoint: str | None = Field(
        default=None, validation_alias=DEPRECATED_S3_ENV,
        description="deprecated alias of AWS_ENDPOINT_URL_S3, read when that is unset")
    aws_region: str = Field(
        default="us-east-1", validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="S3 region; credentials come from boto3's own chain (AWS_ACCESS_KEY_ID, profiles, roles)")
    work_dir: str = Field(
        default=".enginefoundry/work", validation_alias="EF_WORK_DIR",
        description="scratch space for converted checkpoints, bundles, logs and reports (relative: to the "
                    "working directory)")
    cache_dir: str | None = Field(
        default=None, validation_alias="EF_CACHE_DIR",
        description="download cache for S3 and local sources, and the migrated empty MLflow and Prefect "
                    "databases new SQLite files start from (default ~/.cache/enginefoundry)")
    lease_ttl_s: float = Field(
        default=120.0, validation_alias="EF_LEASE_TTL_S",
        description="seconds a build lease lives without its holder's heartbeat (renewed every quarter of it); "
                    "a holder that died on this host loses it at once")
    lease_wait_s: float = Field(
        default=6 * 3600.0, validation_alias="EF_LEASE_WAIT_S",
        description="longest wait for another run that holds a unit's lease before giving up")
    s3_max_attempts: int = Field(
        default=5, validation_alias="EF_S3_MAX_ATTEMPTS",
        description="S3 calls per request, the first included (botocore's standard retry mode)")
    reference_cache: str | None = Field(
        default=None, validation_alias="EF_REFERENCE_CACHE",
        description="local cache of smoke reference answers (default ~/.cache/enginefoundry/references)")
    unit_timeout_s: float = Field(
        default=8 * 3600, validation_alias="EF_UNIT_TIMEOUT_S",
        description="cluster mode: a unit run not finished this long after the parent sent it is cancelled and "
                    "counts as failed (a unit held back behind its pool's limit is not timed until it is sent)")
    cancel_poll_s: float = Field(
        default=2.0, gt=0, validation_alias="EF_CANCEL_POLL_S",
        description="how often a run asks the Prefect API whether it or its parent was cancelled "
                    "(tasks/cancel_watch.py)")
    trtllm_examples_dir: str | None = Field(
        default=None, validation_alias="EF_TRTLLM_EXAMPLES_DIR",
        description="trtllm-engine lane: the examples/ folder of the installed TensorRT-LLM")
    modelopt_dir: str | None = Field(
        default=None, validation_alias="EF_MODELOPT_DIR",
        description="Model-Optimizer checkout (its examples/llm_ptq or examples/hf_ptq), for quantized "
                    "conversions")
    hf_endpoint: str | None = Field(
        default=None, validation_alias="HF_ENDPOINT",
        description="Hugging Face Hub endpoint (read by huggingface_hub; a mirror or the test hub)")
    prefect_api_url: str | None = Field(
        default=None, validation_alias="PREFECT_API_URL",
        description="Prefect server (read by Prefect); unset: embedded mode's ephemeral API")

    def s3_endpoint(self) -> tuple[str | None, str | None]:
        """(value, variable it came from): AWS_ENDPOINT_URL_S3, else the deprecated EF_S3_ENDPOINT."""
        if self.s3_endpoint_url:
            return self.s3_endpoint_url, "AWS_ENDPOINT_URL_S3"
        if self.deprecated_s3_endpoint:
            warnings.warn(f"{DEPRECATED_S3_ENV} is deprecated: set AWS_ENDPOINT_URL_S3 (boto3's own variable)",
                          DeprecationWarning, stacklevel=2)
            return self.deprecated_s3_endpoint, DEPRECATED_S3_ENV
        return None, None



@lru_cache(maxsize=16)
def _parsed_environment(environ: tuple[tuple[str, str], ...]) -> EnvSettings:
    """EnvSettings of `environ` (the key: the whole environment, so any change parses it again)."""
    return EnvSettings()


def env_table() -> list[tuple[str, str, str]]:
    """(variable, default, what it sets) for every field, in declaration order: the table in docs/configuration.md."""
    rows = []
    for field in EnvSettings.model_fields.values():
        alias = field.validation_alias
        names = alias.choices if isinstance(alias, AliasChoices) else [alias]
        default = "-" if field.default is None else str(field.default)
        rows.append((" / ".join(f"`{n}`" for n in names), default, field.description or ""))
    return rows


Origin = Literal["flag", "parameter", "environment", "spec", "default"]


class Effective(BaseModel):
    """One effective setting and where it came from, e.g. store from environment EF_STORE."""

    name: str
    value: str | None
    origin: Origin
    detail: str  # the flag, variable or spec field

    def row(self) -> dict[str, str]:
        return {"setting": self.name, "value": self.value or "(AWS default)", "from": f"{self.origin} {self.detail}"}


class Destinations(BaseModel):
    store: Effective
    mlflow_uri: Effective
    s3_endpoint_url: Effective

    def rows(self) -> list[dict[str, str]]:
        return [self.store.row(), self.mlflow_uri.row(), self.s3_endpoint_url.row()]


def _pick(name: str, flag: tuple[str | None, str], env: tuple[str | None, str | None],
          spec: tuple[str | None, str, bool], default: str | None) -> Effective:
    if flag[0]:
        # A flow's override parameter ("parameter store") or a CLI flag ("--store").
        origin: Origin = "parameter" if flag[1].startswith("parameter ") else "flag"
        return Effective(name=name, value=flag[0], origin=origin, detail=flag[1].removeprefix("parameter "))
    if env[0]:
        return Effective(name=name, value=env[0], origin="environment", detail=env[1] or "")
    if spec[2] and spec[0]:
        return Effective(name=name, value=spec[0], origin="spec", detail=spec[1])
    return Effective(name=name, value=default, origin="default", detail=spec[1])


def absolute_store(uri: str, base: Path) -> str:
    """file://relative → file:///absolute against base (a scheme of the catalog's local kind); object stores (s3://)
    and absolute paths unchanged."""
    row = scheme_of(uri)
    if row is not None and row.kind is SchemeKind.LOCAL:
        path = Path(row.body(uri))
        return uri if path.is_absolute() else row.prefix + str((base / path).resolve())
    return uri


def absolute_mlflow(uri: str, base: Path) -> str:
    """sqlite:///relative.db → sqlite:////absolute.db against base; a plain folder → file:///absolute; servers
    (http, https, databricks, …) unchanged."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        return uri if path.is_absolute() else "sqlite:///" + str((base / path).resolve())
    if uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
        return uri if path.is_absolute() else "file://" + str((base / path).resolve())
    if "://" not in uri and ":" not in uri.split("/")[0]:
        return (base / uri).resolve().as_uri()
    return uri


def _base(setting: Effective, spec_base: Path) -> Path:
    """Relative paths from a flag or the environment: the working directory; from the spec or its defaults: the
    spec's folder."""
    return Path.cwd() if setting.origin in ("flag", "parameter", "environment") else spec_base


def resolve_destinations(spec: BuildSpec, *, store: str | None = None, mlflow_uri: str | None = None,
                         s3_endpoint_url: str | None = None, env: EnvSettings | None = None,
                         flag_names: tuple[str, str, str] = ("--store", "--mlflow-uri", "--s3-endpoint-url"),
                         ) -> Destinations:
    """The effective destinations (flag > environment > spec > default), relative paths made absolute."""
    env = env or EnvSettings.read()
    spec_base = spec.base_path
    defaults_pub, defaults_trk = type(spec.publish)(), type(spec.tracking)()
    st = _pick("store", (store, flag_names[0]), (env.store, "EF_STORE"),
               (spec.publish.store, "publish.store", "store" in spec.publish.model_fields_set),
               defaults_pub.store)
    st = st.model_copy(update={"value": absolute_store(st.value or "", _base(st, spec_base))})
    ml = _pick("mlflow_uri", (mlflow_uri, flag_names[1]), (env.mlflow_tracking_uri, "MLFLOW_TRACKING_URI"),
               (spec.tracking.mlflow_uri, "tracking.mlflow_uri", "mlflow_uri" in spec.tracking.model_fields_set),
               defaults_trk.mlflow_uri)
    ml = ml.model_copy(update={"value": absolute_mlflow(ml.value or "", _base(ml, spec_base))})
    s3 = _pick("s3_endpoint_url", (s3_endpoint_url, flag_names[2]), env.s3_endpoint(),
               (spec.publish.s3_endpoint_url, "publish.s3_endpoint_url",
                "s3_endpoint_url" in spec.publish.model_fields_set), None)
    return Destinations(store=st, mlflow_uri=ml, s3_endpoint_url=s3)


def apply_destinations(spec: BuildSpec, dest: Destinations) -> BuildSpec:
    """The spec with its effective destinations written in (what flows, units and manifests then use)."""
    from enginefoundry.errors import SpecError
    from enginefoundry.spec.outputs import PublishSpec, TrackingSpec

    try:
        publish = PublishSpec.model_validate({**spec.publish.model_dump(), "store": dest.store.value,
                                              "s3_endpoint_url": dest.s3_endpoint_url.value})
        tracking = TrackingSpec.model_validate({**spec.tracking.model_dump(), "mlflow_uri": dest.mlflow_uri.value})
    except ValidationError as err:  # a flag or variable the spec's own validation never saw (`--store ftp://x`)
        settings = {"store": dest.store, "s3_endpoint_url": dest.s3_endpoint_url, "mlflow_uri": dest.mlflow_uri}
        raise SpecError([(_origin_of(settings, e["loc"]), e["msg"].removeprefix("Value error, "))
                         for e in err.errors()], "destinations") from None
    return spec.model_copy(update={"publish": publish, "tracking": tracking})


def _origin_of(settings: dict[str, Effective], loc: tuple[Any, ...]) -> str:
    """The flag, variable or spec field a destination came from, for a message naming what to fix."""
    setting = settings.get(str(loc[0])) if loc else None
    return setting.detail or setting.name if setting is not None else ".".join(map(str, loc))


def effective_spec(spec: BuildSpec, *, store: str | None = None, mlflow_uri: str | None = None,
                   s3_endpoint_url: str | None = None,
                   flag_names: tuple[str, str, str] = ("--store", "--mlflow-uri", "--s3-endpoint-url"),
                   ) -> tuple[BuildSpec, Destinations]:
    dest = resolve_destinations(spec, store=store, mlflow_uri=mlflow_uri, s3_endpoint_url=s3_endpoint_url,
                                flag_names=flag_names)
    if any(f.startswith("parameter ") for f in flag_names):
        dest = true_origins(dest, resolve_destinations(spec))
    return apply_destinations(spec, dest), dest


def true_origins(given: Destinations, underlying: Destinations) -> Destinations:
    """A flow's override parameter that only repeats what this process's environment, the spec or the default
    says (the CLI passes its effective destinations so a worker's environment cannot change them) is reported
    with that origin ("environment EF_STORE", "spec publish.store"), not as a parameter nobody typed."""
    picked = {}
    for name in ("store", "mlflow_uri", "s3_endpoint_url"):
        mine, theirs = getattr(given, name), getattr(underlying, name)
        picked[name] = theirs if mine.origin == "parameter" and mine.value == theirs.value else mine
    return Destinations(**picked)


def cache_root() -> Path:
    """EF_CACHE_DIR, else ~/.cache/enginefoundry."""
    return Path(EnvSettings.read().cache_dir or Path.home() / ".cache" / "enginefoundry")


def work_root() -> Path:
    """Scratch space for converted checkpoints, bundles, logs and reports ($EF_WORK_DIR)."""
    return Path(EnvSettings.read().work_dir).resolve()
