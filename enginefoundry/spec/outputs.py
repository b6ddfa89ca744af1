"""Where results go: the artifact store and MLflow."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from enginefoundry.catalog.schemes import SchemeKind, scheme_of, store_forms
from enginefoundry.confine import normalise_prefix


class PublishSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    store: str = Field(
        default="file://.enginefoundry/store",
        description="s3://bucket/prefix or file://path (relative to the working directory); --store overrides it",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3 endpoint (SeaweedFS, MinIO); defaults to $EF_S3_ENDPOINT or AWS"
    )
    require_signature: bool = Field(
        default=False, description="builds must be signed: `run`/`rollout` refuse to start without a signing key "
                                   "and rebuild (signed) a cache hit that is unsigned or signed by an untrusted "
                                   "key, and pull, promote and rollout with this spec refuse a build whose "
                                   "signatures do not verify against the trusted keys")
    trusted_keys: list[str] = Field(
        default_factory=list, description="public key files whose signatures are accepted (`enginefoundry keygen` "
                                          "writes <name>.pub), relative to the spec; added to --trusted-key")
    trust_policy: str | None = Field(
        default=None, description="a trust policy file (keys with their validity), relative to the spec; "
                                  "--trust-policy may not name another one")

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str) -> str:
        row = scheme_of(value)  # the catalog's scheme rows (enginefoundry/catalog/schemes.py)
        if row is None:
            raise ValueError(f"'{value}' is not a store URI: use {store_forms()}")
        if row.kind is SchemeKind.OBJECT:
            bucket, _, prefix = row.body(value).partition("/")
            if not bucket:
                raise ValueError(f"'{value}' has no bucket: use {row.store_form}")
            # The prefix becomes part of every object key: `..` or `.` segments would move the store.
            prefix = normalise_prefix(prefix, f"the prefix of store '{value}'")
            return f"{row.prefix}{bucket}/{prefix}" if prefix else f"{row.prefix}{bucket}"
        return value.rstrip("/")


class TrackingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mlflow_uri: str = Field(
        default="sqlite:///.enginefoundry/mlflow.db",
        description="MLflow tracking URI (the CLI flag --mlflow-uri overrides it)",
    )
    experiment: str = Field(default="enginefoundry", description="MLflow experiment of the runs")
    registered_model: str | None = Field(default=None, description="defaults to the model name")
