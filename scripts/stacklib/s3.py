"""SeaweedFS (`weed mini`) as the S3 store: explicit internal ports, credentials enforced, buckets created."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from stacklib.net import HOST, http_status, port_is_free
from stacklib.state import StackError, State
from stacklib.supervisor import READY_TIMEOUT_S, Context, Outcome, child_env, executable, launch

REGION = "us-east-1"


BUCKETS = ("enginefoundry", "mlflow")


# weed mini opens these HTTP listeners besides S3 (facts §1.2), each with a gRPC twin at port + 10000. They
# are picked once per state dir and persisted, so a second stack (e.g. the pytest one) never collides with the
# dev stack on 9333/8888/9340/23646 (8888 is also Jupyter's default). The twins keep the +10000 default on
# purpose: mini's maintenance worker dials admin.port + 10000 even when -admin.port.grpc says otherwise
# (4.48, seen in the log), so the range keeps every twin below the kernel's ephemeral ports (32768+).
WEED_HTTP_PORTS = ("master.port", "filer.port", "volume.port", "admin.port")


WEED_GRPC_OFFSET = 10000


WEED_PORT_RANGE = range(10000, 22768)


def weed_internal_ports(state: State, avoid: set[int]) -> dict[str, int]:
    """HTTP ports for weed's internal servers plus an explicit S3 gRPC port (the S3 port itself may be high
    enough that its +10000 twin does not exist); reused from the last start while still free."""
    path = state.root / "s3-internal-ports.json"
    names = (*WEED_HTTP_PORTS, "s3.port.grpc")
    try:
        ports: dict[str, int] = json.loads(path.read_text())
        if set(ports) == set(names) and all(weed_pair_free(p, avoid) for p in ports.values()):
            return ports
    except FileNotFoundError:
        pass
    chosen: list[int] = []
    taken = set(avoid)
    for port in random.sample(WEED_PORT_RANGE, len(WEED_PORT_RANGE)):
        if weed_pair_free(port, taken):
            chosen.append(port)
            taken |= {port, port + WEED_GRPC_OFFSET}
            if len(chosen) == len(names):
                break
    else:
        raise StackError(f"s3: no free port pairs (p, p+{WEED_GRPC_OFFSET}) left in {WEED_PORT_RANGE}")
    ports = dict(zip(names, chosen, strict=True))
    path.write_text(json.dumps(ports, indent=2) + "\n")
    return ports


def weed_pair_free(port: int, avoid: set[int]) -> bool:
    pair = (port, port + WEED_GRPC_OFFSET)
    return not avoid.intersection(pair) and all(port_is_free(p) for p in pair)


# weed's volume server marks every volume read-only while the disk under its folder has less free space than
# -minFreeSpace (default 1 %: `weed volume -h`, 4.48; `weed mini` has no flag for it): then every PutObject, in
# every bucket, is an InternalError ("No writable volumes and no free volumes left", server log). Measured
# 2026-12-02 with 1.5 GiB free of 252 GiB: a running server refused every write within 20 s, and a fresh one
# never became ready (a fresh-clone CI run on a shared disk failed 47 tests that way). Refused up front.
READ_ONLY_FREE_FRACTION = 0.01


def low_disk(folder: Path) -> str | None:
    """Why SeaweedFS cannot write under `folder`, or None while the disk has room above its read-only mark."""
    usage = shutil.disk_usage(folder)
    mark = usage.total * READ_ONLY_FREE_FRACTION
    if usage.free >= mark:
        return None
    gib = 2**30
    return (
        f"the disk holding {folder} has {usage.free / gib:.2f} GiB free, under SeaweedFS's read-only mark "
        f"({READ_ONLY_FREE_FRACTION:.0%} of {usage.total / gib:.1f} GiB = {mark / gib:.2f} GiB): every write "
        "would fail with InternalError; free disk space there and run `up` again"
    )


def start_s3(ctx: Context) -> Outcome:
    reason = low_disk(ctx.state.root)
    if reason:
        raise StackError(f"s3: {reason}")
    # The pair in weed's environment becomes its only identity; without it the S3 API is open (facts §1.2).
    env = child_env(ctx.state, ctx.creds)
    outcome = launch(ctx, "s3", lambda: weed_argv(ctx), env, lambda: http_status(ctx.url("s3") + "/") is not None)
    check_s3_auth(ctx)
    create_buckets(ctx)
    return outcome


VOLUME_MAX = 1000  # volumes (one per bucket at least): not bound to the free disk in GiB (weed_argv)


def weed_argv(ctx: Context) -> list[str]:
    avoid = {p + d for p in ctx.ports.values() for d in (0, WEED_GRPC_OFFSET)}
    internal = weed_internal_ports(ctx.state, avoid)
    # Every port flag is explicit: weed mini reloads flags of earlier starts from <dir>/mini.options for any
    # flag left out, so an omitted one would silently come back with an old (maybe now taken) port.
    ports = [f"-{flag}={port}" for flag, port in internal.items()]
    ports += [f"-{flag}.grpc={internal[flag] + WEED_GRPC_OFFSET}" for flag in WEED_HTTP_PORTS]
    return [
        executable("weed"),
        "mini",
        f"-dir={ctx.state.root / 's3'}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        # weed mini sizes its volume count from the free disk (free GiB / a 1 GiB volume size, `weed mini -h`,
        # 4.48) and gives every bucket a volume of its own: with 6 GiB free the 7th bucket's first PutObject is an
        # InternalError ("failed to find writable volumes for collection"). Volumes are not preallocated (facts
        # §1.2), so a fixed count reserves no disk; the disk itself stays the limit.
        f"-volume.max={VOLUME_MAX}",
        f"-s3.port={ctx.ports['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *ports,
    ]


def check_s3_auth(ctx: Context) -> None:
    """Guard against the credential trap: an unsigned ListBuckets must be refused."""
    status = http_status(ctx.url("s3") + "/")
    if status != 403:
        raise StackError(
            f"s3 answered an unsigned request with HTTP {status} (expected 403): the credentials "
            "were not applied and the store is open; run `down` and check the s3 log"
        )


def create_buckets(ctx: Context) -> None:
    import boto3  # lazy: boto3 costs ~0.5 s to import and only `up` with s3 needs it
    from botocore.config import Config
    from botocore.exceptions import ClientError, EndpointConnectionError

    client = boto3.client(
        "s3",
        endpoint_url=ctx.url("s3"),
        region_name=REGION,
        aws_access_key_id=ctx.creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=ctx.creds["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    for bucket in BUCKETS:
        # The S3 port answers a moment before the filer behind it accepts writes, hence the retry loop.
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except ClientError as err:
                if err.response["Error"]["Code"] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    break
                if time.monotonic() > deadline:
                    raise StackError(f"s3: cannot create bucket {bucket}: {err}") from err
            except EndpointConnectionError as err:
                if time.monotonic() > deadline:
                    raise StackError(f"s3: cannot create bucket {bucket}: {err}") from err
            time.sleep(0.3)
    # Buckets that exist already (a restart on the same folder) prove nothing about the volume servers, which
    # answer 500 InternalError for a few seconds after the S3 port opens: ready means a write reads back.
    while True:
        try:
            for bucket in BUCKETS:
                client.put_object(Bucket=bucket, Key=".stack-ready", Body=b"ok")
                if client.get_object(Bucket=bucket, Key=".stack-ready")["Body"].read() != b"ok":
                    raise StackError(f"s3: bucket {bucket} returned other bytes than were written")
            return
        except (ClientError, EndpointConnectionError) as err:
            if time.monotonic() > deadline:
                disk = low_disk(ctx.state.root)
                why = f" ({disk})" if disk else ""
                raise StackError(f"s3: written objects do not read back: {err}{why}") from err
        time.sleep(0.3)
