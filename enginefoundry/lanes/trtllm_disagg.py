"""Disaggregated serving on lane trtllm (issue 37 item 3): the files a predicted disaggregated configuration (prefill
and decode workers, `enginefoundry.spec.search.Disagg`) is served with: the `trtllm-serve disaggregated -c`
configuration (the router: hostname, port, context_servers / generation_servers with num_instances and urls), one
LLM-API YAML per role (its parallelism, batch size, `cache_transceiver_config`, `disable_overlap_scheduler`) and one
`trtllm-serve` command per worker. Every key carries its release range and upstream evidence (`KEYS` here, the
per-role parallel keys in `trtllm_flags.EMITTED`), and each one is checked against the release it is emitted for: a
release without a key is refused with the field and the fix, one after the evidence is listed as to be probed.

Each worker's command names its GPUs (`env CUDA_VISIBLE_DEVICES=…`, consecutive ids, TP*PP of them, as NVIDIA's
example starts them: REF_DISAGG_GPUS); a row whose GPU count is not its workers' sum is refused.

Not yet here: the searched unit that carries these files through build, publish and the benchmark (a disaggregated
benchmark needs GPUs: several `trtllm-serve` processes and the KV-cache transfer between them; the commands name the
model as the spec does, not a built checkpoint), and the worker's probe of the installed release for these keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enginefoundry.errors import SpecError
from enginefoundry.inputs.toolchain import parse_version
from enginefoundry.lanes.trtllm_flags import (
    ABSENT,
    LLM_API,
    SERVE,
    TO_BE_PROBED,
    Flag,
    arg,
    flag,
    ref_aic,
)
from enginefoundry.schemas.loose import TrtllmConfig
from enginefoundry.spec.search import Disagg, Worker

ROUTER = "trtllm-serve disaggregated config (-c)"
ROUTER_CMD = "trtllm-serve disaggregated"

REF_DISAGG_UTILS = ("tensorrt_llm/llmapi/disagg_utils.py@0228a71223416496ff056a157936bad2e42c762f (extract_disagg_cfg: "
                    "hostname, port, context_servers, generation_servers; extract_ctx_gen_cfgs: num_instances, urls "
                    "'host:port', as many urls as num_instances)")
REF_DISAGG_DOCS_10 = ("NVIDIA/TensorRT-LLM docs/source/1.0/features/disagg-serving.md (trtllm-serve disaggregated -c; "
                      "cache_transceiver_config backend DEFAULT/UCX/NIXL/MPI and max_tokens_in_buffer; "
                      "disable_overlap_scheduler on the context servers)")
REF_DISAGG_DOCS_13 = "docs 1.3.0rc24/features/disagg-serving.html"
REF_DISAGG_EXAMPLE = ("NVIDIA/TensorRT-LLM examples/disaggregated/README.md@c3c3d76e28c57ee23adc3458fc6aca87300c8c21 "
                      "(ctx_config.yaml: disable_overlap_scheduler: True, cache_transceiver_config backend UCX; "
                      "trtllm-serve disaggregated -c disagg_config.yaml)")
REF_DISAGG_GPUS = ("NVIDIA/TensorRT-LLM examples/disaggregated/README.md@013971245ed5ddb230f1917dd8ccce711a17280f "
                   "(each worker started as `CUDA_VISIBLE_DEVICES=<its GPUs> trtllm-serve …`; a replica's ranks are "
                   "the sum of TP*PP over its context and generation servers)")
REF_AIC_RULE = ("aiconfigurator 0.12.0 generator/rule_plugin/trtllm.rule (prefill disable_overlap_scheduler = true, "
                "decode = false; cache_transceiver max_tokens_in_buffer = ceil((isl + osl + 500) / tokens_per_block) "
                "× tokens_per_block)")
# NVIDIA's 1.0.0rc3 template has disable_overlap_scheduler but no cache_transceiver_config; 1.0.0rc4 and every later
# one has it (tests/fixtures/aiconfigurator-templates/keys.json).
TRANSCEIVER_SINCE = "1.0.0rc4"
REF_TRANSCEIVER = (ref_aic("1.0.0rc4", "1.0.0", "1.3.0rc23") + " (cache_transceiver_config.backend, "
                   ".max_tokens_in_buffer); absent from " + ref_aic("1.0.0rc3"))

_ROUTER_REFS = (REF_DISAGG_UTILS, REF_DISAGG_DOCS_10, REF_DISAGG_EXAMPLE, REF_DISAGG_DOCS_13)

KEYS: tuple[Flag, ...] = (
    *(Flag(ROUTER, n, refs=_ROUTER_REFS) for n in (
        "hostname", "port", "context_servers", "context_servers.num_instances", "context_servers.urls",
        "generation_servers", "generation_servers.num_instances", "generation_servers.urls")),
    Flag(ROUTER_CMD, "c", refs=(REF_DISAGG_DOCS_10, REF_DISAGG_EXAMPLE, REF_DISAGG_DOCS_13)),
    *(Flag(LLM_API, n, since=TRANSCEIVER_SINCE, refs=(REF_TRANSCEIVER, REF_DISAGG_DOCS_10, REF_DISAGG_DOCS_13))
      for n in ("cache_transceiver_config", "cache_transceiver_config.backend",
                "cache_transceiver_config.max_tokens_in_buffer")),
    Flag(LLM_API, "disable_overlap_scheduler",
         refs=(ref_aic("1.0.0rc3", "1.0.0", "1.3.0rc23"), REF_AIC_RULE, REF_DISAGG_EXAMPLE)),
)
_INDEX = {(f.tool, f.key): f for f in KEYS}
TRANSCEIVER_BACKENDS = ("DEFAULT", "UCX", "NIXL", "MPI")  # docs 1.0 features/disagg-serving.md


def key_status(tool: str, name: str, release: str) -> tuple[Flag, str]:
    """The entry and its status in `release`: one of this module's keys, else the lane's own registry
    (trtllm_flags.EMITTED). A `since` naming a release candidate is compared with the rc (1.0.0rc3 is before
    1.0.0rc4); a series (`1.0`, the floor) with the series, as `Flag.status` does."""
    entry = _INDEX.get((tool, name)) or flag(tool, name)
    since = parse_version(entry.since)
    if since.suffix and parse_version(release).sort_key < since.sort_key:
        return entry, ABSENT
    return entry, entry.status(release)


@dataclass(frozen=True)
class DisaggServing:
    """What serves one disaggregated replica."""

    config: TrtllmConfig
    context: TrtllmConfig
    generation: TrtllmConfig
    commands: list[list[str]]  # one `env CUDA_VISIBLE_DEVICES=… trtllm-serve` per worker, then the router
    to_be_probed: list[str] = field(default_factory=list)  # keys past their evidence: the worker's probe decides


# JSON edge: the role's LLM-API YAML keys (written as YAML)
def _role_parallel(w: Worker, role: str, moe: bool) -> tuple[TrtllmConfig, list[tuple[str, str]]]:
    """A role's LLM-API parallel keys, as the search maps an aggregated MoE row (search.plan.searched_variant):
    tensor_parallel_size = moe_tp × moe_ep, enable_attention_dp = dp > 1."""
    problems: list[tuple[str, str]] = []
    # JSON edge: the role's LLM-API YAML keys
    out: TrtllmConfig = {"tensor_parallel_size": w.tp, "pipeline_parallel_size": w.pp}
    if moe or w.dp > 1:
        world = w.moe_tp * w.moe_ep
        if w.dp > 1 and w.tp > 1:
            problems.append((f"{role}.dp", f"attention tp {w.tp} inside attention DP {w.dp}: TensorRT-LLM's "
                                           "attention DP runs attention with tp 1 on every rank"))
        elif world != w.tp * w.dp:
            problems.append((f"{role}.moe_ep", f"moe_tp × moe_ep = {world} is not its {w.tp * w.dp} attention "
                                               "ranks (tp × dp)"))
        out = {"tensor_parallel_size": world, "pipeline_parallel_size": w.pp}
        if w.moe_ep > 1 or w.moe_tp > 1:
            out |= {"moe_expert_parallel_size": w.moe_ep, "moe_tensor_parallel_size": w.moe_tp}
        if w.dp > 1:
            out["enable_attention_dp"] = True
    return out, problems


# JSON edge: a YAML document's key paths
def _key_paths(data: TrtllmConfig, prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        out.append(prefix + key)
        if isinstance(value, dict):
            out += _key_paths(value, prefix + key + ".")
    return out


def disaggregated_serving(disagg: Disagg, release: str, model: str, *, isl: int, osl: int, moe: bool = False,
                          host: str = "localhost", port: int = 8000, backend: str = "DEFAULT",
                          tokens_per_block: int = 32) -> DisaggServing:
    """The router config, the two role YAMLs and the commands for `release`, or SpecError naming each key the
    release lacks (toolchain.trtllm_version) and each shape TensorRT-LLM does not run, with the fix."""
    problems: list[tuple[str, str]] = []
    if backend not in TRANSCEIVER_BACKENDS:
        choices = ", ".join(TRANSCEIVER_BACKENDS)
        problems.append(("cache_transceiver_config.backend", f"{backend!r} is not one of {choices} "
                                                             f"({REF_DISAGG_DOCS_10})"))
    # AIConfigurator's own rule for the buffer: the whole sequence (+500) in whole KV blocks.
    buffer = -(-(isl + osl + 500) // tokens_per_block) * tokens_per_block
    # JSON edge: each role's LLM-API YAML
    roles: dict[str, TrtllmConfig] = {}
    for role, w, overlap_off in (("context", disagg.prefill, True), ("generation", disagg.decode, False)):
        parallel, bad = _role_parallel(w, role, moe)
        problems += bad
        roles[role] = {**parallel, "max_batch_size": w.batch_size, "disable_overlap_scheduler": overlap_off,
                       "cache_transceiver_config": {"backend": backend, "max_tokens_in_buffer": buffer}}
    urls = {"context": [f"{host}:{port + 1 + i}" for i in range(disagg.prefill.workers)],
            "generation": [f"{host}:{port + 1 + disagg.prefill.workers + i}" for i in range(disagg.decode.workers)]}
    # JSON edge: the router's YAML
    config: TrtllmConfig = {"hostname": host, "port": port,
                              "context_servers": {"num_instances": disagg.prefill.workers, "urls": urls["context"]},
                              "generation_servers": {"num_instances": disagg.decode.workers,
                                                     "urls": urls["generation"]}}
    to_probe: list[str] = []
    emitted = [(ROUTER, k) for k in _key_paths(config)] + [(ROUTER_CMD, "c")] + sorted(
        {(LLM_API, k) for y in roles.values() for k in _key_paths(y)})
    for tool, key in emitted:
        entry, status = key_status(tool, key, release)
        if status == ABSENT:
            problems.append(("toolchain.trtllm_version", (
                f"TensorRT-LLM {release} has no {key} ({tool}; first in {entry.since}: {entry.refs[0]}): pin "
                f"toolchain.trtllm_version ≥ {entry.since}, or set search.disaggregated: false")))
        elif status == TO_BE_PROBED:
            to_probe.append(f"{tool} {key}")
    # A worker's GPUs: its TP*PP (REF_DISAGG_GPUS; tensor_parallel_size is moe_tp × moe_ep under MoE).
    workers = _workers({r: int(y["tensor_parallel_size"]) * int(y["pipeline_parallel_size"]) for r, y in roles.items()},
                       urls)
    gpus = sum(len(ids) for _, _, ids in workers)
    if gpus != disagg.total_gpus:
        problems.append(("search.disaggregated", f"the predicted row counts {disagg.total_gpus} GPUs, its workers "
                                                 f"{gpus} (the sum of TP*PP over them: {REF_DISAGG_GPUS})"))
    if problems:
        raise SpecError(problems, "disaggregated serving")
    commands = [["env", f"CUDA_VISIBLE_DEVICES={','.join(map(str, ids))}",
                 "trtllm-serve", model, arg(SERVE, "host"), u.split(":")[0], arg(SERVE, "port"), u.split(":")[1],
                 arg(SERVE, "extra_llm_api_options"), f"{role}.yaml"]
                for role, u, ids in workers]
    commands.append(["trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"])
    return DisaggServing(config=config, context=roles["context"], generation=roles["generation"],
                         commands=commands, to_be_probed=to_probe)


def _workers(ranks: dict[str, int], urls: dict[str, list[str]]) -> list[tuple[str, str, list[int]]]:
    """(role, url, GPU ids) of every worker, a role's worker on `ranks[role]` GPUs (its TP*PP): consecutive ids from
    0, the context workers' first."""
    out, at = [], 0
    for role in ("context", "generation"):
        for url in urls[role]:
            out.append((role, url, list(range(at, at + ranks[role]))))
            at += ranks[role]
    return out


def compat_section(releases: dict[str, str]) -> list[str]:
    """docs/trtllm-compat.md's section for disaggregated serving: each key × release (column → the release it is
    judged at; 1.0.0rc3 added, the release before the KV-cache transceiver), its evidence, and the refusals."""
    columns = {"1.0.0rc3": "1.0.0rc3", **releases}
    lines = ["", "## Disaggregated serving (`search.disaggregated`, lane trtllm)", "",
             "A predicted disaggregated configuration (prefill and decode workers) is served by one `trtllm-serve` per "
             "worker with its role's LLM-API YAML (`context.yaml`: `disable_overlap_scheduler: true`; "
             "`generation.yaml`: `false`; both: the role's parallelism and batch size, `cache_transceiver_config` "
             "with `backend` and `max_tokens_in_buffer` = the whole sequence + 500 in whole KV blocks, "
             "AIConfigurator's own rule) and the router `trtllm-serve disaggregated -c disagg_config.yaml` "
             "(`hostname`, `port`, "
             "`context_servers` / `generation_servers` with `num_instances` and one `host:port` url per instance). "
             "Each worker is started on its own GPUs, `env CUDA_VISIBLE_DEVICES=<ids>` with TP*PP consecutive ids, "
             f"as NVIDIA's example starts them ({REF_DISAGG_GPUS}); a row whose GPU count is not its workers' sum "
             "is refused. "
             "`enginefoundry search --json` carries these files per disaggregated row (`serving`) for the pinned "
             "release; the unit that builds and benchmarks them is not done yet (the benchmark needs GPUs). Refused, "
             "with the field and the fix: a release without a key below (`toolchain.trtllm_version`: pin the first "
             "release that has it, or set `search.disaggregated: false`), a role with attention tp inside attention DP "
             "or whose moe_tp × moe_ep is not its tp × dp, a transceiver backend other than "
             f"{', '.join(TRANSCEIVER_BACKENDS)}. The per-role parallel keys (`tensor_parallel_size`, "
             "`pipeline_parallel_size`, `max_batch_size`, `moe_*`, `enable_attention_dp`) are the LLM API YAML rows "
             "above.", "",
             "| item | tool | since | " + " | ".join(columns) + " | evidence |",
             "|---|---|---|" + "---|" * len(columns) + "---|"]
    marks = {ABSENT: "—", TO_BE_PROBED: "?"}
    for f in KEYS:
        cells = " | ".join(marks.get(key_status(f.tool, f.key, r)[1], "✓") for r in columns.values())
        item = f"`-{f.key}`" if f.tool == ROUTER_CMD else f"`{f.key}`"
        lines.append(f"| {item} | {f.tool} | {f.since} | {cells} | {'; '.join(f.refs)} |")
    return lines
