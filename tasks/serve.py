"""Stage: serve the bundle on a free loopback port; always stopped by `stop_server`.

The smoke stage judges the lane's smoke server (`Lane.smoke_serve_command`: for the reference lane, one that
returns log-probs); the benchmark measures the server the unit ships with. Where they are the same server, one
start serves both."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.errors import ToolError
from enginefoundry.lanes import get_lane
from enginefoundry.model_server import Endpoint, free_port, start_server, stop_server
from enginefoundry.spec import BuildSpec
from enginefoundry.tasks._log import progress_logger


@task(name="start server", cache_policy=NO_CACHE)
def start_unit_server(spec: BuildSpec, bundle_dir: str, log_dir: str, for_smoke: bool = False,
                      twin: bool = False) -> Endpoint:
    """The unit's own server, or with `for_smoke` the one its smoke stage judges (which may be another: its
    Endpoint says `shipped=False`, and its log is smoke-server.log), or with `twin` a speculative unit's
    non-speculative twin (`Lane.twin_serve_command`; log twin-server.log)."""
    log = progress_logger()
    lane, bundle, port = get_lane(spec.lane), Path(bundle_dir), free_port()
    if twin:
        twin_cmd = lane.twin_serve_command(bundle, "127.0.0.1", port, spec.model.name)
        if twin_cmd is None:
            raise ToolError(f"lane {spec.lane}: the bundle {bundle} has no non-speculative twin to serve")
        cmd, log_name = twin_cmd, "twin-server.log"
    else:
        cmd = (lane.smoke_serve_command(bundle, "127.0.0.1", port, spec.model.name, spec.lane_options)
               if for_smoke else lane.named_serve_command(bundle, "127.0.0.1", port, spec.model.name))
        log_name = "server.log" if cmd.shipped else "smoke-server.log"
    log(f"serve: {cmd.command.description} starting" + ("" if cmd.shipped else " (for the smoke stage only)"))
    endpoint = start_server(cmd, Path(log_dir) / log_name)
    log(f"serve: healthy at {endpoint.base_url} after {endpoint.startup_s}s")
    return endpoint


@task(name="stop server", cache_policy=NO_CACHE)
def stop_unit_server(endpoint: Endpoint) -> None:
    stop_server(endpoint.pid)
