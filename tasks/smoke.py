"""Stage: the smoke gate of the served unit against the Hugging Face reference (the code of `enginefoundry smoke`)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.model_server import Endpoint, is_alive
from enginefoundry.smoke import LmEvalConfig, SmokeReport, load_prompt_set, run_lm_eval, run_smoke, write_report
from enginefoundry.spec import BuildSpec
from enginefoundry.store import open_store
from enginefoundry.tasks._log import progress_logger


@task(name="smoke test", cache_policy=NO_CACHE)
def smoke_test(spec: BuildSpec, endpoint: Endpoint, reference_dir: str, report_dir: str,
               lm_eval: LmEvalConfig | None = None, max_logprob_diff: float | None = None,
               precision: str = "fp32", weights_digest: str | None = None) -> SmokeReport:
    """The gate on the spec's prompt set, with the unit's precision-family policy; reference answers are
    looked up by key in the artifact store (computed and published on a miss). Optional lm-eval tasks are
    reported beside it, not gated."""
    log = progress_logger()
    prompts = load_prompt_set(spec.resolve_path(spec.smoke.prompts))
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    report = run_smoke(spec.smoke, prompts, reference_dir=Path(reference_dir), base_url=endpoint.base_url,
                       model_name=endpoint.model_name, served_tokenizer_dir=Path(endpoint.tokenizer_dir),
                       precision=precision, progress=log, server_alive=lambda: is_alive(endpoint.pid),
                       max_logprob_diff=max_logprob_diff, store=store, weights_digest=weights_digest)
    if lm_eval is not None:
        report.lm_eval = run_lm_eval(lm_eval, base_url=endpoint.base_url, model=endpoint.model_name,
                                     tokenizer=endpoint.tokenizer_dir, out=Path(report_dir) / "lm_eval", progress=log)
        log(f"smoke: lm-eval {report.lm_eval.status}: {report.lm_eval.detail}")
    write_report(report, Path(report_dir))
    log(f"smoke: {'PASS' if report.passed else 'FAIL'}: {report.verdict.reason} "
        f"(judged against {report.reference.label()})")
    return report
