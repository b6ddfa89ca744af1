"""One way to make an S3 client: endpoint from the spec or the environment, path-style, retried."""

from __future__ import annotations

from typing import Any

from enginefoundry.catalog.schemes import scheme_of
from enginefoundry.settings import EnvSettings


def s3_endpoint(explicit: str | None = None) -> str | None:
    """The S3 endpoint: explicit (a flag or the spec, already ranked by enginefoundry.settings), else
    $AWS_ENDPOINT_URL_S3 (or the deprecated $EF_S3_ENDPOINT), else AWS itself."""
    return explicit or EnvSettings.read().s3_endpoint()[0]


# boto3 edge: an S3Client; Any here because boto3-stubs is installed without its s3 extra (mypy_boto3_s3)
def s3_client(endpoint_url: str | None = None, *, max_pool: int = 16, max_attempts: int | None = None) -> Any:
    """`max_attempts`: calls per request, retries included (default $EF_S3_MAX_ATTEMPTS's setting)."""
    # boto3 and botocore (17 MB) are imported here, not at the top: a file:// store never needs them, and the GPU
    # run bundle (scripts/gpu_bundle.py) leaves them out to fit the device tool's 64 MiB.
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},  # SeaweedFS/MinIO on loopback have no virtual-host DNS
        # botocore's "standard" mode retries transient errors only (connection errors, 5xx, throttling codes
        # such as SlowDown) with truncated exponential backoff and full jitter: rand(0,1)·min(scale·2^i, 20 s),
        # scale 1 s when throttled, 0.05 s otherwise (botocore/retries/standard.py ExponentialBackoff,
        # botocore 1.44.8). max_attempts counts the first call.
        retries={"max_attempts": max_attempts or EnvSettings.read().s3_max_attempts, "mode": "standard"},
        max_pool_connections=max_pool,
        connect_timeout=5,
        read_timeout=60,
    )
    # A fresh session per client: boto3's default session caches the first credentials it resolves, so
    # rotated or per-run credentials in the environment would otherwise be ignored.
    return boto3.session.Session().client(
        "s3", endpoint_url=s3_endpoint(endpoint_url), config=config,
        region_name=EnvSettings.read().aws_region,
    )


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix → (bucket, prefix without trailing slash); any object-kind scheme of the catalog."""
    row = scheme_of(uri)
    body = row.body(uri) if row else uri
    bucket, _, prefix = body.partition("/")
    return bucket, prefix.strip("/")
