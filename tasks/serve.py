"""Stage: serve the bundle on a free loopback port; always stopped by `stop_server`."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.lanes import get_lane
from enginefoundry.model_server import Endpoint, free_port, start_server, stop_server
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger


@task(name="start server", cache_policy=NO_CACHE)
def start_unit_server(spec: BuildSpec, bundle_dir: str, log_dir: str) -> Endpoint:
    log = progress_logger()
    cmd = get_lane(spec.lane).named_serve_command(Path(bundle_dir), "127.0.0.1", free_port(), spec.model.name)
    log(f"serve: {cmd.command.description} starting")
    endpoint = start_server(cmd, Path(log_dir) / "server.log")
    log(f"serve: healthy at {endpoint.base_url} after {endpoint.startup_s}s")
    return endpoint


@task(name="stop server", cache_policy=NO_CACHE)
def stop_unit_server(endpoint: Endpoint) -> None:
    stop_server(endpoint.pid)
