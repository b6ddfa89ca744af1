"""Stage: accuracy smoke test of the served unit against the local Hugging Face reference."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.serving import Endpoint
from enginefoundry.smoke import SmokeReport, load_prompt_set, run_smoke, write_report
from enginefoundry.spec import BuildSpec
from tasks._log import progress_logger


@task(name="smoke test", cache_policy=NO_CACHE)
def smoke_test(spec: BuildSpec, endpoint: Endpoint, reference_dir: str, report_dir: str) -> SmokeReport:
    log = progress_logger()
    prompts = load_prompt_set(spec.resolve_path(spec.smoke.prompts))
    report = run_smoke(spec.smoke, prompts, reference_dir=Path(reference_dir), base_url=endpoint.base_url,
                       model_name=endpoint.model_name, served_tokenizer_dir=Path(endpoint.tokenizer_dir),
                       progress=log)
    write_report(report, Path(report_dir))
    log(f"smoke: {'PASS' if report.passed else 'FAIL'}: {report.verdict.reason}")
    return report
