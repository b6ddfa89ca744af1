"""Stages: the unit's reference answers, then the smoke gate of the served unit against them (the code of
`enginefoundry smoke`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from enginefoundry.errors import InputError
from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.inputs.adapters import merged_source
from enginefoundry.inputs.quantized_source import DEQUANTIZED, read_quantization
from enginefoundry.inputs.sources import SourceSnapshot, fetch
from enginefoundry.lanes.registry import get_lane
from enginefoundry.model_server import Endpoint, is_alive
from enginefoundry.planning.preflight import dequantizes
from enginefoundry.smoke import (
    SmokeInputs,
    SmokeReport,
    load_prompt_set,
    run_lm_eval,
    run_smoke,
    twin_answers,
    with_twin_answers,
    write_report,
)
from enginefoundry.smoke.fallback import PROXIES, bounded_by_cast, load_or_compute_quantization_spread
from enginefoundry.smoke.gate import GateRule
from enginefoundry.smoke.lm_eval import spec_lm_eval
from enginefoundry.smoke.reference import (
    ReferenceAsk,
    ReferenceOutcome,
    ReferenceSet,
    ReferenceSettings,
    load_or_compute_reference,
    load_or_compute_spread,
    publish_sibling_reference,
)
from enginefoundry.smoke.sibling import SiblingRef, sibling_reference
from enginefoundry.smoke.simulated import (
    FROM_EXPORT_WHY,
    PREQUANTIZED_WHY,
    export_problem,
    simulated_dtype,
    simulated_reference,
)
from enginefoundry.spec import BuildSpec
from enginefoundry.spec.checks import SIMULATED_REFERENCE, UNIT_PRECISION
from enginefoundry.store.backends import open_store
from enginefoundry.tasks._log import progress_logger


@task(name="smoke reference", cache_policy=NO_CACHE)
def smoke_reference(spec: BuildSpec, reference_dir: str, weights_digest: str | None = None,
                    sibling: SiblingRef | None = None, *, precision: str,
                    checkpoint_dir: str | None = None) -> tuple[ReferenceSet, ReferenceOutcome]:
    """The answers the unit (of `precision`) is judged against, found by key in the artifact store: its sibling
    unit's served answers (refused when the sibling was rejected or never served these prompts), else the
    source's greedy answers in the dtype `smoke.reference_precision` gives this unit (`unit`: its own where
    transformers computes it; `simulated`: an int8_wo/int4_wo unit's are its quantization's simulated model's, and
    an int4_awq unit's on a lane that exports ModelOpt's unified checkpoint its converted checkpoint's
    (`checkpoint_dir`), dequantized; both on the host CPU, with the source's answers in the same dtype for the
    quantization-cost rule), computed and published on a miss (on the host CPU, or on the unit's GPUs before
    its server takes them; like with like on GPUs also measures the log-prob spread there, before the server)."""
    log = progress_logger()
    cases = load_prompt_set(spec.resolve_path(spec.smoke.prompts)).cases
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    trust = InputTrust.of_run(spec, progress=log)  # a run that signs uses only answers a trusted key signed
    if sibling is not None:
        ref, outcome = sibling_reference(sibling, spec, cases, store=store, model_dir=Path(reference_dir),
                                         trust=trust)
        log(f"smoke: judged against {outcome.label()}")
        return ref, outcome.model_copy(update={"inputs": list(trust.consumed)})
    dtype, why = spec.smoke.reference_for(precision)
    device = spec.smoke.reference_device.value
    prequantized = read_quantization(Path(reference_dir))
    export = _export_to_dequantize(spec, precision, Path(reference_dir), checkpoint_dir, log)
    original = unquantized_original(spec, log) if prequantized is not None else None
    ask = ReferenceAsk(cases, spec.smoke.max_new_tokens, device,
                       quantized_inputs=get_lane(spec.lane).quantizes_activations)
    settings = ReferenceSettings(store=store, trust=trust, progress=log)
    if spec.smoke.simulates(precision) or export is not None:
        log(f"smoke: the reference of this {precision} unit: "
            + (f"{PREQUANTIZED_WHY if prequantized is not None else FROM_EXPORT_WHY} ({export})"
               if export is not None else why))
        # In the dtype the lane's build computes in: its dtype option, else the checkpoint's (fp16 for fp32).
        sim_dtype = _build_dtype(spec, Path(reference_dir))
        ref, outcome = simulated_reference(Path(reference_dir), precision, ask, settings,
                                           weights_digest=weights_digest, checkpoint=export, dtype=sim_dtype,
                                           original=original)
    else:
        log(f"smoke: the reference of this {precision} unit: the {dtype} source ({why})")
        ref, outcome = load_or_compute_reference(Path(reference_dir), ask, settings, dtype=dtype,
                                                 weights_digest=weights_digest)
    if (spec.smoke.like_with_like(precision) or outcome.simulated is not None) and outcome.device == "gpu":
        load_or_compute_spread(Path(outcome.model_dir), cases, ref, store=store, device="gpu", progress=log,
                               trust=trust)
    elif (outcome.device == "gpu" and outcome.simulated is None and precision in PROXIES and outcome.dtype == "fp32"
          and spec.smoke.reference_precision in (UNIT_PRECISION, SIMULATED_REFERENCE)):
        # No like-with-like reference: its quantization spread, on the unit's GPUs before its server takes them.
        load_or_compute_quantization_spread(Path(reference_dir), cases, ref, precision=precision,
                                            dtype=_build_dtype(spec, Path(reference_dir)), device="gpu", progress=log)
    elif outcome.device == "gpu" and bounded_by_cast(precision, outcome):
        # A 16-bit unit against a fixed fp32 reference: the spread of the source cast to its dtype, likewise.
        load_or_compute_quantization_spread(Path(reference_dir), cases, ref, precision=precision, dtype=precision,
                                            device="gpu", progress=log)
    return ref, outcome.model_copy(update={"inputs": list(trust.consumed)})


def _export_to_dequantize(spec: BuildSpec, precision: str, reference_dir: Path, checkpoint_dir: str | None,
                          log: Callable[[str], None]) -> Path | None:
    """The quantized checkpoint the unit is judged against, dequantized: a pre-quantized source itself (refused
    where the gate cannot dequantize it), else the unit's converted checkpoint where its lane exports one the gate
    reads; None: the source is the reference."""
    export = Path(checkpoint_dir) if checkpoint_dir and dequantizes(spec, precision) else None
    prequantized = read_quantization(reference_dir)
    if prequantized is not None:  # the source is the export: judged against its dequantized self, on every lane
        if not prequantized.dequantizable:
            raise InputError(f"smoke: the source is pre-quantized ({prequantized.label()}): the gate has no "
                             f"reference for it (it dequantizes {', '.join(sorted(DEQUANTIZED))} exports without a "
                             "quantized KV cache); use such an export, or the unquantized checkpoint as model.source")
        export = reference_dir
    problem = export_problem(export) if export is not None else None
    if problem is not None:
        dtype, why = spec.smoke.reference_for(precision)
        log(f"smoke: the converted checkpoint {export} is not dequantized ({problem}): judged against the {dtype} "
            f"source instead ({why})")
        return None
    return export


def unquantized_original(spec: BuildSpec, log: Callable[[str], None]) -> Path | None:
    """`model.unquantized`, fetched here (the stage that needs it, on whichever machine runs it; the Hugging Face
    cache, the S3 cache folder or the local folder make a second fetch a lookup), None where the spec names none.
    InputError where it is quantized itself."""
    src = spec.model.parsed_unquantized(spec.base_path)
    if src is None:
        return None
    snapshot = fetch(src, progress=log)
    if snapshot.quantization is not None:
        raise InputError(f"model.unquantized: {snapshot.uri} is quantized too ({snapshot.quantization.label()}); "
                         "point it at the unquantized checkpoint the export was made from")
    return Path(snapshot.local_dir)


def _build_dtype(spec: BuildSpec, source: Path) -> str:
    """The dtype the unit's quantized build computes in: the lane's dtype option, else the checkpoint's."""
    return simulated_dtype(source, get_lane(spec.lane).dtype_option(spec))


@task(name="smoke test", cache_policy=NO_CACHE)
def smoke_test(spec: BuildSpec, endpoint: Endpoint, reference_dir: str, report_dir: str, precision: str = "fp32",
               weights_digest: str | None = None,
               reference: tuple[ReferenceSet, ReferenceOutcome] | None = None,
               serves_unit: tuple[str, str] | None = None) -> SmokeReport:
    """The gate on the spec's prompt set, with the unit's precision-family policy, against `reference` (from
    `smoke_reference`; without it the source reference is looked up by key, computed and published on a miss).
    The report names the server it judged (`endpoint.server`). `serves_unit` (name, key): this unit is a
    sibling reference, its served answers are published for the units it judges. The spec's lm-eval tasks
    (`smoke.lm_eval`) are reported beside it, not gated."""
    log = progress_logger()
    prompts = load_prompt_set(spec.resolve_path(spec.smoke.prompts))
    store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    trust = InputTrust.of_run(spec, progress=log)
    ref, outcome = reference if reference is not None else (None, None)
    report = run_smoke(SmokeInputs(spec.smoke, prompts, reference_dir=Path(reference_dir), base_url=endpoint.base_url,
                       model_name=endpoint.model_name, served_tokenizer_dir=Path(endpoint.tokenizer_dir),
                       precision=precision, progress=log, server_alive=lambda: is_alive(endpoint.pid),
                       store=store, weights_digest=weights_digest,
                       reference=ref, reference_outcome=outcome, server_log=Path(endpoint.log_path),
                       reference_device=spec.smoke.reference_device.value, trust=trust,
                       build_dtype=_build_dtype(spec, Path(reference_dir)),
                       speculative=spec.speculative is not None,
                       twin_body=get_lane(spec.lane).speculative_twin(spec),
                       request_body=endpoint.request_body or None,
                       original_dir=(unquantized_original(spec, log)
                                     if read_quantization(Path(reference_dir)) is not None else None)))
    report.server = endpoint.server or None
    if serves_unit is not None:
        name, key = serves_unit
        published = publish_sibling_reference(report.served_answers, unit=name, unit_key=key, cases=prompts.cases,
                                              max_new_tokens=spec.smoke.max_new_tokens, store=store, trust=trust)
        log(f"smoke: {len(published.answers)} served answers of {name} published as the sibling reference "
            f"{published.key.digest[:12]}")
    lm_eval = spec_lm_eval(spec.smoke.lm_eval, spec.base_path)
    if lm_eval is not None:
        report.lm_eval = run_lm_eval(lm_eval, base_url=endpoint.base_url, model=endpoint.model_name,
                                     tokenizer=endpoint.tokenizer_dir, out=Path(report_dir) / "lm_eval", progress=log)
        log(f"smoke: lm-eval {report.lm_eval.status}: {report.lm_eval.detail}")
    write_report(report, Path(report_dir))
    log(f"smoke: {'PASS' if report.passed else 'FAIL'}: {report.verdict.reason} "
        f"(judged against {report.reference.label()}; server {endpoint.server or endpoint.base_url})")
    return report


@task(name="smoke twin", cache_policy=NO_CACHE)
def smoke_twin(spec: BuildSpec, twin: Endpoint, report: SmokeReport, report_dir: str) -> SmokeReport:
    """A speculative unit's rule `lossless speculation` on its lane's twin server (`Lane.twin_serve_command`, the
    same bundle without speculation, started after the unit's own server was stopped): every smoke prompt asked
    again of it, its greedy answers and finish reasons compared with the unit's; the report written again."""
    log = progress_logger()
    prompts = load_prompt_set(spec.resolve_path(spec.smoke.prompts))
    theirs = twin_answers(twin.base_url, twin.model_name, spec.smoke, prompts.cases, log,
                          server_alive=lambda: is_alive(twin.pid))
    report = with_twin_answers(report, theirs)
    write_report(report, Path(report_dir))
    log(f"smoke: {'PASS' if report.passed else 'FAIL'} with the twin server's answers: {report.verdict.reason}")
    return report


@task(name="smoke served adapters", cache_policy=NO_CACHE)
def smoke_served_adapters(spec: BuildSpec, endpoint: Endpoint, base: SourceSnapshot,
                          adapters: dict[str, SourceSnapshot], report: SmokeReport, report_dir: str,
                          precision: str = "fp32") -> SmokeReport:
    """A unit serving the base and every adapter (model.adapter_mode serve): each adapter asked as its lane's server
    selects it (`model: <adapter>`, or lane trtllm's `lora_request`: Lane.adapter_request) and judged by the whole
    gate against its own fp32 reference, the base with that adapter merged (build.adapters.merged_source, as merge
    mode computes it), its report in `adapters/<name>`. The unit's
    report (the base's, asked by the model's name) gains one hard rule per adapter: a unit that answers with the
    base, or another adapter, where an adapter was asked for fails that adapter's gate and is rejected."""
    log = progress_logger()
    lane = get_lane(spec.lane)
    for name, adapter in adapters.items():
        merged = merged_source(base, name, adapter, log)
        reference = smoke_reference.fn(spec, merged.local_dir, merged.weights_digest, precision=precision)
        selected = lane.adapter_request(spec, name)
        asked = endpoint.model_copy(update={"model_name": name} if selected is None else {"request_body": selected})
        how = f"model '{name}'" if selected is None else f"{', '.join(selected)} '{name}'"
        theirs = smoke_test.fn(spec, asked, merged.local_dir, str(Path(report_dir) / "adapters" / name),
                               precision=precision, weights_digest=merged.weights_digest, reference=reference)
        detail = (f"asked as {how}, judged against its own reference (the base with {name} merged, "
                  f"{merged.weights_digest[:12]}): {theirs.verdict.reason}")
        report.verdict = report.verdict.with_rule(GateRule(name=f"adapter {name}", ok=theirs.passed, detail=detail,
                                                           kind="hard"))
        # what the adapter's gate consumed besides its named sources (its reference's, its own), bound by digest
        report.inputs += [i for i in [*reference[1].inputs, *theirs.inputs] if i not in report.inputs]
    write_report(report, Path(report_dir))
    log(f"smoke: {'PASS' if report.passed else 'FAIL'} with every served adapter: {report.verdict.reason}")
    return report
