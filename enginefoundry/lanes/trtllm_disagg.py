"""Disaggregated serving on lane trtllm (issue 37 item 3): the files a predicted disaggregated configuration (prefill
and decode workers, `enginefoundry.spec.search.Disagg`) is served with: the `trtllm-serve disaggregated -c`
configuration (the router: hostname, port, context_servers / generation_servers with num_instances and urls), one
LLM-API YAML per role (its parallelism, batch size, `cache_transceiver_config`, `disable_overlap_scheduler`) and one
`trtllm-serve` command per worker. Every key carries its release range and upstream evidence (`KEYS` here, the
per-role parallel keys in `trtllm_flags.EMITTED`), and each one is checked against the release it is emitted for: a
release without a key is refused with the field and the fix, one after the evidence is listed as to be probed.

Each worker's command names its GPUs (`env CUDA_VISIBLE_DEVICES=…`, consecutive ids, TP*PP of them, as NVIDIA's
example starts them: REF_DISAGG_GPUS); a row whose GPU count is not its workers' sum is refused.

A variant with `disaggregated` (enginefoundry.spec.matrix.Disagg) is a unit like any other: the build writes these files
into the bundle against the built checkpoint (`bundle_files`), with the unit's own runtime keys (KV cache, lengths,
CUDA graphs, dtype) under each role's, and warms each role up on the GPUs; the server the smoke gate and the benchmark
talk to is the router, started with its workers by the bundle's `disagg_launch.py` (enginefoundry.lanes.disagg_launch,
standard library only, so the published serve.sh runs it where only TensorRT-LLM is installed). The worker's probe
reads `trtllm-serve disaggregated --help` and the LLM-API fields (`describe` names the router command and each role's
YAML keys).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from enginefoundry.errors import SpecError
from enginefoundry.inputs.toolchain import parse_version
from enginefoundry.lanes import disagg_launch
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
from enginefoundry.spec import BuildSpec
from enginefoundry.spec.matrix import Disagg, Variant, Worker

ROUTER = "trtllm-serve disaggregated config (--config_file)"
ROUTER_CMD = "trtllm-serve disaggregated"

REF_DISAGG_UTILS = ("tensorrt_llm/llmapi/disagg_utils.py@0228a71223416496ff056a157936bad2e42c762f (extract_disagg_cfg: "
                    "hostname, port, context_servers, generation_servers; extract_ctx_gen_cfgs: num_instances, urls "
                    "'host:port', as many urls as num_instances)")
REF_DISAGG_DOCS_10 = ("NVIDIA/TensorRT-LLM docs/source/1.0/features/disagg-serving.md (trtllm-serve disaggregated -c; "
                      "cache_transceiver_config backend DEFAULT/UCX/NIXL/MPI and max_tokens_in_buffer; "
                      "disable_overlap_scheduler on the context servers)")
REF_DISAGG_DOCS_13 = "docs 1.3.0rc24/features/disagg-serving.html"
REF_ROUTER_CLI = ("tensorrt_llm/commands/serve.py@00209af149e7774406881a37283dce303571eb11 (click command "
                  "`disaggregated`: -c/--config_file, -m/--metadata_server_config_file, -t/--server_start_timeout, "
                  "-r/--request_timeout, -l/--log_level, --metrics-log-interval; `main = DefaultGroup(commands={serve, "
                  "grpc, disaggregated, …})`)")
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
    # `-c` in NVIDIA's examples; its long name is what the probe can check (`--config_file` in --help).
    Flag(ROUTER_CMD, "config_file", refs=(REF_ROUTER_CLI, REF_DISAGG_DOCS_10, REF_DISAGG_EXAMPLE, REF_DISAGG_DOCS_13)),
    *(Flag(LLM_API, n, since=TRANSCEIVER_SINCE, refs=(REF_TRANSCEIVER, REF_DISAGG_DOCS_10, REF_DISAGG_DOCS_13))
      for n in ("cache_transceiver_config", "cache_transceiver_config.backend",
                "cache_transceiver_config.max_tokens_in_buffer")),
    Flag(LLM_API, "disable_overlap_scheduler",
         refs=(ref_aic("1.0.0rc3", "1.0.0", "1.3.0rc23"), REF_AIC_RULE, REF_DISAGG_EXAMPLE)),
)
_INDEX = {(f.tool, f.key): f for f in KEYS}
TRANSCEIVER_BACKENDS = ("DEFAULT", "UCX", "NIXL", "MPI")  # docs 1.0 features/disagg-serving.md
# KvCacheConfig.tokens_per_block's default (trtllm_options: "1.x default 32"): the KV-cache transceiver's buffer is
# whole blocks of it, unless lane option tokens_per_block sets another.
DEFAULT_TOKENS_PER_BLOCK = 32


def own_labels(labels: list[str]) -> list[str]:
    """Those of `labels` (DisaggServing.to_be_probed) that are this module's keys, not the lane registry's."""
    own = {f"{f.tool} {f.key}" for f in KEYS}
    return [label for label in labels if label in own]


def key_status(tool: str, name: str, release: str) -> tuple[Flag, str]:
    """The entry and its status in `release`: one of this module's keys, else the lane's own registry
    (trtllm_flags.EMITTED). A `since` naming a release candidate is compared with the rc (1.0.0rc3 is before
    1.0.0rc4); a series (`1.0`, the floor) with the series, as `Flag.status` does."""
    entry = _INDEX.get((tool, name)) or flag(tool, name)
    since = parse_version(entry.since)
    if since.suffix and parse_version(release).sort_key < since.sort_key:
        return entry, ABSENT
    return entry, entry.status(release)


ROLE_FILES = {"context": "context.yaml", "generation": "generation.yaml"}  # NVIDIA's example's roles, by file
ROUTER_FILE = "disagg_config.yaml"
LAUNCH_PLAN = "disagg.json"  # what disagg_launch.py starts: the router's config and each worker's role and GPUs
LAUNCHER = "disagg_launch.py"
ROLE_FIELDS = {"context": "prefill", "generation": "decode"}  # the spec's names of the roles (Disagg)
# Keys a role sets itself: the unit's runtime config loses them under a role (its parallelism, its batch size).
_ROLE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size",
              "moe_tensor_parallel_size", "enable_attention_dp", "max_batch_size")


@dataclass(frozen=True)
class DisaggServing:
    """What serves one disaggregated replica."""

    config: TrtllmConfig
    roles: dict[str, TrtllmConfig]  # "context" / "generation" → the role's LLM-API YAML (ROLE_FILES)
    commands: list[list[str]]  # one `env CUDA_VISIBLE_DEVICES=… trtllm-serve` per worker, then the router
    to_be_probed: list[str] = field(default_factory=list)  # keys past their evidence: the worker's probe decides
    workers: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (role, url, GPU ids) per worker


# JSON edge: the role's LLM-API YAML keys (written as YAML)
def _role_parallel(w: Worker, role: str, moe: bool) -> tuple[TrtllmConfig, list[tuple[str, str]]]:
    """A role's LLM-API parallel keys, as the search maps an aggregated MoE row (search.plan.searched_variant):
    tensor_parallel_size = moe_tp × moe_ep, enable_attention_dp = dp > 1. A role that sets moe_tp or moe_ep is
    taken as MoE whatever the config said (a dense model's refusal is preflight's, with its config.json)."""
    problems: list[tuple[str, str]] = []
    # JSON edge: the role's LLM-API YAML keys
    out: TrtllmConfig = {"tensor_parallel_size": w.tp, "pipeline_parallel_size": w.pp}
    if moe or w.dp > 1 or w.moe_tp > 1 or w.moe_ep > 1:
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


def _field(where: str, path: str) -> str:
    """A problem's field: as the search names it (`context.dp`), or under a variant's `disaggregated`
    (`variants.0.disaggregated.prefill.dp`)."""
    if not where:
        return path
    role, _, rest = path.partition(".")
    return f"{where}.{ROLE_FIELDS[role]}.{rest}" if role in ROLE_FIELDS else where


def disaggregated_serving(disagg: Disagg, release: str | None, model: str, *, isl: int, osl: int, moe: bool = False,
                          host: str = "localhost", port: int = 8000, backend: str = "DEFAULT",
                          tokens_per_block: int = 32, base: TrtllmConfig | None = None,
                          where: str = "") -> DisaggServing:
    """The router config, the two role YAMLs and the commands for `release`, or SpecError naming each key the
    release lacks (toolchain.trtllm_version) and each shape TensorRT-LLM does not run, with the fix. `release` None
    (an unpinned toolchain): every key is left to the worker's probe. `base`: the unit's runtime config, whose keys
    each role keeps under its own; `where`: the spec field of a variant's `disaggregated`, for the problems."""
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
        problems += [(_field(where, f), m) for f, m in bad]
        # The unit's runtime keys a role keeps (its own parallelism and batch size replace the rest); a CUDA-graph
        # batch cap above the role's batch size is lowered to it.
        kept = {k: v for k, v in (base or {}).items() if k not in _ROLE_KEYS}
        graphs = kept.get("cuda_graph_config")
        if isinstance(graphs, dict) and isinstance(graphs.get("max_batch_size"), int):
            kept["cuda_graph_config"] = {**graphs, "max_batch_size": min(int(graphs["max_batch_size"]), w.batch_size)}
        roles[role] = {**kept, **parallel, "max_batch_size": w.batch_size, "disable_overlap_scheduler": overlap_off,
                       "cache_transceiver_config": {"backend": backend, "max_tokens_in_buffer": buffer}}
    urls = {"context": [f"{host}:{port + 1 + i}" for i in range(disagg.prefill.workers)],
            "generation": [f"{host}:{port + 1 + disagg.prefill.workers + i}" for i in range(disagg.decode.workers)]}
    # JSON edge: the router's YAML
    config: TrtllmConfig = {"hostname": host, "port": port,
                              "context_servers": {"num_instances": disagg.prefill.workers, "urls": urls["context"]},
                              "generation_servers": {"num_instances": disagg.decode.workers,
                                                     "urls": urls["generation"]}}
    to_probe: list[str] = []
    emitted = [(ROUTER, k) for k in _key_paths(config)] + [(ROUTER_CMD, "config_file")] + sorted(
        {(LLM_API, k) for y in roles.values() for k in _key_paths(y)})
    for tool, key in emitted:
        if release is None:
            to_probe.append(f"{tool} {key}")
            continue
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
    if gpus != disagg.gpus:
        problems.append((where or "search.disaggregated", f"the predicted row counts {disagg.gpus} GPUs, its "
                                                          f"workers {gpus} (the sum of TP*PP over them: "
                                                          f"{REF_DISAGG_GPUS})"))
    if problems:
        raise SpecError(problems, "disaggregated serving")
    commands = [["env", f"CUDA_VISIBLE_DEVICES={','.join(map(str, ids))}",
                 "trtllm-serve", model, arg(SERVE, "host"), u.split(":")[0], arg(SERVE, "port"), u.split(":")[1],
                 arg(SERVE, "extra_llm_api_options"), ROLE_FILES[role]]
                for role, u, ids in workers]
    commands.append(["trtllm-serve", "disaggregated", "--" + _INDEX[(ROUTER_CMD, "config_file")].name, ROUTER_FILE])
    return DisaggServing(config=config, roles=roles, commands=commands, to_be_probed=to_probe, workers=workers)


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
             "release, and a chosen row is a unit (a variant with `disaggregated`, written by hand or by the search): "
             "its build writes them into the bundle against the built checkpoint, with the unit's runtime keys under "
             "each role's, and warms each role up; its server is the router, started with its workers by the "
             "bundle's `disagg_launch.py` (each worker on free ports, healthy before the router starts), which the "
             "smoke gate and the benchmark talk to. The worker's probe reads `trtllm-serve disaggregated --help` "
             "for `--config_file` and the LLM API fields for each role's keys. Refused, "
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
        item = f"`--{f.key}`" if f.tool == ROUTER_CMD else f"`{f.key}`"
        lines.append(f"| {item} | {f.tool} | {f.since} | {cells} | {'; '.join(f.refs)} |")
    return lines


def bundle_files(bundle: Path, serving: DisaggServing) -> dict[str, str]:
    """Write the router config, the role YAMLs, the launch plan and the launcher into `bundle`; {role: its YAML's
    name}. The launch plan (LAUNCH_PLAN, JSON) is what disagg_launch.py reads: the router's config and each worker's
    role, YAML and GPU ids (the ports are chosen when it starts)."""
    (bundle / ROUTER_FILE).write_text(yaml.safe_dump(serving.config, sort_keys=False))
    for role, name in ROLE_FILES.items():
        (bundle / name).write_text(yaml.safe_dump(serving.roles[role], sort_keys=False))
    plan = {"router": serving.config,
            "workers": [{"role": role, "config": ROLE_FILES[role], "gpus": ids} for role, _, ids in serving.workers]}
    (bundle / LAUNCH_PLAN).write_text(json.dumps(plan, indent=1) + "\n")
    shutil.copyfile(disagg_launch.__file__, bundle / LAUNCHER)
    return dict(ROLE_FILES)


def variant_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """(field, message with the fix) for each disaggregated variant lane trtllm cannot serve, before any download:
    parallelism given outside the roles, a role shape TensorRT-LLM does not run, a key the pinned release lacks (an
    unpinned toolchain leaves the keys to the worker's probe), and what this pipeline does not serve
    disaggregated."""
    out: list[tuple[str, str]] = []
    for i, v in enumerate(spec.variants):
        if v.disaggregated is None:
            continue
        where = f"variants.{i}.disaggregated"
        for name, given in (("tp", v.tp != 1), ("pp", v.pp != 1), ("moe_ep", v.moe_ep != 1),
                            ("moe_tp", v.moe_tp is not None), ("attention_dp", v.attention_dp)):
            if given:
                out.append((f"variants.{i}.{name}", f"a disaggregated variant's parallelism is each role's: set it "
                                                    f"in {where}.prefill and .decode (tp, pp, dp, moe_tp, moe_ep) "
                                                    f"and remove {name}"))
        try:
            disaggregated_serving(v.disaggregated, spec.toolchain.trtllm_version, spec.model.name, isl=0, osl=0,
                                  where=where)
        except SpecError as e:
            out += e.problems
    if not any(v.disaggregated for v in spec.variants):
        return out
    why = "not with a disaggregated variant here"
    if spec.speculative is not None:
        out.append(("speculative", f"{why}: the gate's lossless check compares the unit with its non-speculative "
                                   "twin, which this pipeline serves for one aggregated server only: build the "
                                   "speculative unit aggregated, or remove speculative"))
    if spec.model.serves_adapters:
        out.append(("model.adapter_mode", f"{why}: the evidence read shows per-request lora_request on one "
                                          "trtllm-serve, not through the disaggregated router: use adapter_mode: "
                                          "merge, or an aggregated variant"))
    if getattr(spec.lane_options, "triton", False):
        out.append(("lane_options.triton", f"{why}: the LLM API Triton model serves one aggregated LLM: set "
                                           "lane_options.triton: false"))
    return out


def role_variants(v: Variant) -> dict[str, tuple[Variant, int]]:
    """A disaggregated variant's roles as the aggregated variants their workers are, with their batch sizes: what
    preflight estimates memory and checks experts with, role by role (the mapping `_role_parallel` writes:
    tensor_parallel_size = moe_tp × moe_ep with MoE fields or attention DP, else tp)."""
    d = v.disaggregated
    if d is None:
        return {}
    out = {}
    for role, w in (("context", d.prefill), ("generation", d.decode)):
        moe = w.moe_tp > 1 or w.moe_ep > 1
        if moe or w.dp > 1:
            rv = v.model_copy(update={"disaggregated": None, "tp": w.moe_tp * w.moe_ep, "pp": w.pp,
                                      "moe_ep": w.moe_ep, "moe_tp": w.moe_tp if moe else None,
                                      "attention_dp": w.dp > 1})
        else:
            rv = v.model_copy(update={"disaggregated": None, "tp": w.tp, "pp": w.pp})
        out[role] = (rv, w.batch_size)
    return out
