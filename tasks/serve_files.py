"""Stage: the serving files of a unit whose gates passed (serve command line + config), beside its bundle."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.lanes import get_lane
from enginefoundry.lanes.serve_files import serving_plan, write_serving_files
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import open_store
from enginefoundry.store.publish import manifests_prefix
from enginefoundry.tasks._log import progress_logger


@task(name="write serving files", task_run_name="serving files {unit_name}", cache_policy=NO_CACHE)
def write_serving(spec: BuildSpec, unit_name: str, key: str, bundle_dir: str, checkpoint_dir: str | None,
                  checkpoint_uri: str | None, out_dir: str) -> str:
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    plan = serving_plan(get_lane(spec.lane), Path(bundle_dir), unit=unit_name, model=spec.model.name, key=key,
                        artifact_uri=store.url(manifests_prefix(spec.model.name, key)),
                        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None, checkpoint_uri=checkpoint_uri)
    write_serving_files(plan, Path(out_dir))
    progress_logger()(f"serving: {' '.join(plan.argv[:3])} … (serving/serve.sh, serving/serve.yaml)")
    return out_dir
