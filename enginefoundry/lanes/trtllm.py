"""Lane `trtllm`: TensorRT-LLM ≥ 1.0 on the PyTorch backend (the default since 1.0, PR #5312).

There is no engine. What makes a unit specific to a GPU is (facts §1 "What replaces the per-arch engine"):
1. the checkpoint: the Hugging Face one as is, or a ModelOpt-quantized HF checkpoint (hf_quant_config.json);
2. the runtime config YAML given to `trtllm-serve --extra_llm_api_options` (LLM API args, pydantic
   extra="forbid" upstream, so every key is registered in trtllm_flags and checked against the probed
   `TorchLlmArgs.model_fields`);
3. the autotuner profiling cache (TLLM_AUTOTUNER_CACHE_PATH, PR #7738, from 1.1), filled by a warm-up on a GPU of
   the target. Its first form saves `<stem>.rank{N}.json` beside the given path, later ones the path itself: both
   are looked for. TensorRT-LLM records the version and GPU in it but does not check them when loading, so the
   bundle records them and `serve_command` only uses the cache on the same GPU model and TensorRT-LLM version.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import JsonValue

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.confine import UnsafePathError, check_name
from enginefoundry.errors import InputError, SpecError, ToolError
from enginefoundry.gpu.detect import GPUInfo, detect_gpus
from enginefoundry.gpu.devices import host_facts
from enginefoundry.gpu.precisions import TORCH_DTYPE, activation_dtype
from enginefoundry.inputs.model_config import expert_count, lookup
from enginefoundry.inputs.model_shape import Check, ModelShape, checkpoint_shape, read_model_config
from enginefoundry.inputs.quantized_source import SourceQuantization, read_quantization, spec_quantization
from enginefoundry.inputs.toolchain import ToolSurface, check_against_surface, installed_version, parse_version
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes import lora, moe_parallel, speculation, triton_llmapi, trtllm_disagg
from enginefoundry.lanes.base import (
    BUNDLE_INFO,
    PROBE_CHECK,
    SERVE_CWD_VAR,
    AutotunerCache,
    BuildResult,
    BundleInfo,
    CheckpointRef,
    Command,
    ConvertResult,
    ServeCommand,
    ServeSettings,
    TritonSettings,
    WeightsEstimate,
)
from enginefoundry.lanes.trtllm_base import (
    WORKER_PYTHON,
    TrtllmLaneBase,
    chunked_prefill_check,
    fresh_dir,
    parse_marker_json,
    precision_alternatives,
    precision_checks,
    read_bundle_info,
)
from enginefoundry.lanes.trtllm_flags import (
    ENV,
    EXPORT_FMT_DEPRECATED,
    HF_PTQ,
    LAUNCH_TRITON,
    SERVE,
    TO_BE_PROBED,
    arg,
    assumed_modelopt,
    flag,
    has,
    llm_api_key_paths,
    triton_image_problem,
    unknown_llm_api_keys,
)
from enginefoundry.lanes.trtllm_options import TrtllmOptions, trtllm_options
from enginefoundry.runner import ToolRun, run_tool
from enginefoundry.schemas.bundle_info import DisaggSettings
from enginefoundry.schemas.loose import TrtllmConfig
from enginefoundry.settings import EnvSettings
from enginefoundry.spec import BuildSpec, KVCacheDtype, Precision, SpecAlgorithm, Variant
from enginefoundry.store.backends import clone_or_copy

RUNTIME_CONFIG = "llm_api_options.yaml"
# A speculative unit's non-speculative twin: the same YAML without speculative_config, served by a second
# trtllm-serve after the unit's own is stopped (the smoke gate's lossless rule and the benchmark's speed-up).
TWIN_CONFIG = "llm_api_options.twin.yaml"
# The draft checkpoint (speculative.draft), bundled: the YAML's speculative_model names it relative to the server's
# working folder, which holds it as a link to <bundle>/draft (ServeCommand.links), wherever the unit is unpacked.
BUNDLE_DRAFT_DIR = "draft"
AUTOTUNER_CACHE = "autotuner.cache"
WARMUP_MARKER = "ENGINEFOUNDRY_WARMUP_JSON "
QUANTIZE_TIMEOUT_S = 6 * 3600.0  # a 70B calibration takes hours (#1331)
WARMUP_TIMEOUT_S = 2 * 3600.0  # MoE tactic profiling costs "a few minutes each time" (facts §1)
MODELOPT_ENV = "EF_MODELOPT_DIR"

# variants[].precision → hf_ptq.py --qformat (ModelOpt unified HF export): the catalog's `qformat` column. No
# int8_wo: W8A16 is not in the PyTorch backend's support matrix (validate_options refuses it).
QFORMATS = {p: row.qformat for p, row in PRECISIONS.items() if row.qformat}

# Loads the bundle's YAML exactly as trtllm-serve does (update_llm_args_with_extra_dict turns the nested dicts
# into KvCacheConfig/CudaGraphConfig), generates a few requests so the autotuner profiles, shuts down (the cache is
# saved by then), and prints one JSON line behind a marker: tensorrt_llm prints a banner on stdout. Everything runs
# under the main guard: the LLM API's MPI workers re-import the script (required since 0.16, facts §0).
WARMUP_SCRIPT = f'''"""enginefoundry warm-up: load the checkpoint with the runtime YAML, run requests, shut down."""
import json
import sys
import time


def main():
    import yaml
    from tensorrt_llm import LLM, SamplingParams

    checkpoint, config_path, requests = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(config_path) as f:
        options = yaml.safe_load(f) or {{}}
    try:
        from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
        options = update_llm_args_with_extra_dict({{}}, options)
    except ImportError:
        pass
    t0 = time.monotonic()
    llm = LLM(model=checkpoint, **options)
    load_s = time.monotonic() - t0
    prompts = ["Warm-up request number %d: say something short." % i for i in range(requests)]
    t1 = time.monotonic()
    outputs = llm.generate(prompts, SamplingParams(max_tokens=16))
    generate_s = time.monotonic() - t1
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.shutdown()
    result = {{"load_s": load_s, "generate_s": generate_s, "tokens": tokens}}
    print({WARMUP_MARKER!r} + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
'''


def autotuner_cache_files(folder: Path, name: str = AUTOTUNER_CACHE) -> list[Path]:
    """The autotuner cache a run left in `folder`: `<name>` (later releases) and/or `<stem>.rank{N}.json` (the
    first form of PR #7738, one per rank). Empty files do not count."""
    folder = Path(folder)
    stem = Path(name).stem
    found = sorted(folder.glob(f"{stem}.rank*.json"))
    if (folder / name).is_file():
        found.insert(0, folder / name)
    return [p for p in found if p.stat().st_size > 0]


def hf_ptq_script(modelopt_dir: Path | str, modelopt_version: str | None) -> Path:
    """hf_ptq.py in a Model-Optimizer checkout: examples/llm_ptq until 0.45, examples/hf_ptq from 0.46.0
    (facts §0); a folder that holds hf_ptq.py itself is taken as is."""
    root = Path(modelopt_dir)
    if (root / "hf_ptq.py").is_file():
        return root / "hf_ptq.py"
    if modelopt_version is None:  # on the worker, before the version is known: the one that exists
        found = [p for p in (root / "examples" / d / "hf_ptq.py" for d in ("hf_ptq", "llm_ptq")) if p.is_file()]
        if found:
            return found[0]
    moved = modelopt_version and parse_version(modelopt_version).release >= (0, 46, 0)
    return root / "examples" / ("hf_ptq" if moved else "llm_ptq") / "hf_ptq.py"


# --- lane trtllm ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WarmUp:
    """One warm-up run: its command, what it reported (seconds to load, to generate) and the run itself."""

    command: Command
    load_s: float
    generate_s: float
    run: ToolRun


def kv_cache_dtype_key(variant: Variant) -> str | None:
    """kv_cache_config.dtype for the variant: "fp8" or None (auto: the model's dtype)."""
    return "fp8" if variant.kv_cache_dtype is KVCacheDtype.FP8 else None


def runtime_config(spec: BuildSpec, unit: Unit, version: str | None = None,
                   draft_dir: Path | str | None = None) -> TrtllmConfig:
    """The LLM API YAML for `trtllm-serve --extra_llm_api_options` (and the warm-up). `version`: the TensorRT-LLM
    release it is for (default: the spec's pin), which names the speculative_config fields; `draft_dir`: the
    fetched draft checkpoint (default: a placeholder, for `plan`)."""
    opts = trtllm_options(spec.lane_options)
    v, p = unit.variant, unit.profile
    kv: TrtllmConfig = {"free_gpu_memory_fraction": p.kv_cache_free_gpu_memory_fraction}
    if kv_cache_dtype_key(v):
        kv["dtype"] = kv_cache_dtype_key(v)
    if opts.enable_block_reuse is not None:
        kv["enable_block_reuse"] = opts.enable_block_reuse
    if opts.tokens_per_block is not None:
        kv["tokens_per_block"] = opts.tokens_per_block
    cfg: TrtllmConfig = {
        "tensor_parallel_size": v.tp,
        "pipeline_parallel_size": v.pp,
        "max_batch_size": p.max_batch_size,
        "max_num_tokens": p.max_num_tokens,
        "max_seq_len": p.max_seq_len,
        "kv_cache_config": kv,
    }
    cfg.update(moe_parallel.llm_api_options(v))  # moe_expert/tensor_parallel_size, enable_attention_dp when set
    if v.precision in TORCH_DTYPE:
        # The HF checkpoint passes through unconverted: pin the compute dtype to the variant's.
        cfg["dtype"] = TORCH_DTYPE[v.precision]
    if opts.cuda_graphs:
        cap = opts.cuda_graph_max_batch_size or p.max_batch_size
        cfg["cuda_graph_config"] = {"enable_padding": bool(opts.cuda_graph_padding),
                                    "max_batch_size": min(cap, p.max_batch_size)}
    else:
        cfg["cuda_graph_config"] = None  # null turns CUDA graphs off (the upstream default is on)
    chunked = opts.enable_chunked_prefill
    if chunked is None:
        # A prompt longer than max_num_tokens cannot be scheduled in one step without chunked prefill.
        chunked = p.max_input_len > p.max_num_tokens
    if chunked:
        cfg["enable_chunked_prefill"] = True
    if spec.speculative is not None:
        cfg["speculative_config"] = speculation.speculative_config(
            spec.speculative, version or spec.toolchain.trtllm_version, draft_dir)
    served = lora.lora_config(spec)  # model.adapters in adapter_mode serve only: other specs' YAML is unchanged
    if served is not None:
        cfg["lora_config"] = served.model_dump()
    bad = unknown_llm_api_keys(cfg)
    if bad:  # a programming error: every key must be registered with its release range
        raise AssertionError(f"runtime config has unregistered LLM API keys {bad}")
    return cfg


def write_runtime_configs(bundle: Path, cfg: TrtllmConfig) -> None:
    """The runtime YAML, and with speculative_config its non-speculative twin's (TWIN_CONFIG: every other key the
    same), into the bundle."""
    (bundle / RUNTIME_CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
    if "speculative_config" in cfg:
        twin = {k: v for k, v in cfg.items() if k != "speculative_config"}
        (bundle / TWIN_CONFIG).write_text(yaml.safe_dump(twin, sort_keys=False))


def bundle_draft(bundle: Path, draft_dir: Path | None) -> str | None:
    """The fetched draft copied (cloned where the filesystem can; never hard-linked: the fetched draft of a local
    source is the user's own folder, issue 21) into <bundle>/draft, published and digested with the unit; the name
    the YAML gives it (relative: the server's working folder links it), or None without a draft."""
    if draft_dir is None:
        return None
    shutil.copytree(draft_dir, bundle / BUNDLE_DRAFT_DIR, copy_function=clone_or_copy)
    return BUNDLE_DRAFT_DIR


def warmup_folder(workdir: Path, bundle: Path, *names: str | None) -> Path:
    """The warm-up's working folder: `workdir`, or with a bundled draft or adapters a fresh one beside it that links
    each by the name the YAML gives it (as the server's does)."""
    linked = [n for n in names if n is not None]
    if not linked:
        return workdir
    folder = fresh_dir(workdir / "warmup-cwd")
    for name in linked:
        (folder / name).symlink_to((bundle / name).resolve())
    return folder


def quantize_command(spec: BuildSpec, variant: Variant, source_dir: Path | str, out_dir: Path | str,
                     python: str | None = None, modelopt: str | None = None) -> Command:
    """ModelOpt PTQ to a unified HF checkpoint (hf_quant_config.json) with Model-Optimizer's hf_ptq.py.

    `modelopt`: the installed nvidia-modelopt (probed on the worker); flags it lacks are not emitted
    (--calib_seq from 0.39.0); --export_fmt only below 0.37.0, where the export format's default may differ (from 0.37
    it is deprecated and forced to hf, and still parsed at 0.46.0). `None`: the worker's probe decides."""
    opts = trtllm_options(spec.lane_options)
    root = opts.modelopt_dir or EnvSettings.read().modelopt_dir or f"${MODELOPT_ENV}"
    calib = variant.calibration
    assert calib is not None  # Variant fills a default calibration for quantized precisions
    # hf_ptq.py's KV default changed between releases (fp8, later fp8_cast): always say what the variant wants.
    kv = "fp8" if variant.kv_cache_dtype is KVCacheDtype.FP8 else "none"
    argv = [python or WORKER_PYTHON, str(hf_ptq_script(root, modelopt)),
            arg(HF_PTQ, "pyt_ckpt_path"), str(source_dir),
            arg(HF_PTQ, "qformat"), QFORMATS[variant.precision],
            arg(HF_PTQ, "kv_cache_qformat"), kv,
            arg(HF_PTQ, "dataset"), calib.dataset,
            arg(HF_PTQ, "calib_size"), str(calib.samples)]
    # Unknown ModelOpt (`plan` for a release whose pin is not recorded): only the flags every ModelOpt has.
    calib_seq = modelopt is not None and has(HF_PTQ, "calib_seq", modelopt)
    if calib_seq:
        argv += [arg(HF_PTQ, "calib_seq"), str(calib.max_seq_length)]
    argv += [arg(HF_PTQ, "export_path"), str(out_dir)]
    if has(HF_PTQ, "export_fmt", modelopt) and not at_least(modelopt, EXPORT_FMT_DEPRECATED):
        argv += [arg(HF_PTQ, "export_fmt"), "hf"]  # deprecated and forced to hf from 0.37 (REF_EXPORT_FMT)
    seq = "" if calib_seq else f"; ModelOpt {modelopt} has no --calib_seq: its default length"
    if modelopt is None:
        seq = ("; ModelOpt version unknown until the worker's probe: rendered with the flags every ModelOpt has "
               "(the worker adds --calib_seq where the installed one has it)")
    return Command(argv=argv, cwd=str(Path(out_dir).parent), tool=HF_PTQ,
                   description=f"ModelOpt PTQ {QFORMATS[variant.precision]} → HF checkpoint{seq}")


def warmup_command(python: str, script: Path | str, checkpoint: Path | str, config: Path | str,
                   cache: Path | str | None, requests: int, env: dict[str, str] | None = None,
                   llm_api_keys: list[str] | None = None) -> Command:
    full_env = dict(env or {})
    if cache is not None:
        full_env[flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").name] = str(cache)
    return Command(argv=[python, str(script), str(checkpoint), str(config), str(requests)], env=full_env,
                   llm_api_keys=list(llm_api_keys or []),
                   description="warm-up: load, run requests" + (", fill the autotuner cache" if cache else ""))


def serve_argv(checkpoint: Path | str, config: Path | str, host: str, port: int,
               yaml_flag: str = "extra_llm_api_options") -> list[str]:
    # --extra_llm_api_options exists in every 1.x; its alias --config only since Nov 2025 (PR #9104).
    return ["trtllm-serve", str(checkpoint), arg(SERVE, yaml_flag), str(config),
            arg(SERVE, "host"), host, arg(SERVE, "port"), str(port)]


YAML_FLAGS = ("extra_llm_api_options", "config")  # the trtllm-serve flags that take the runtime YAML


def serve_yaml_flag(surface: ToolSurface | None) -> str:
    """The trtllm-serve flag that takes the runtime YAML: --extra_llm_api_options, or --config when the probed
    --help has only that (a release that dropped the old name). Unknown surface: the old name (every 1.x)."""
    help_ = surface.tools.get(SERVE) if surface else None
    if help_ and not help_.error and "extra_llm_api_options" not in help_.flags and "config" in help_.flags:
        return "config"
    return "extra_llm_api_options"


def at_least(version: str | None, release: str) -> bool:
    """Whether a known `version` is `release` or later (an unknown one is not)."""
    return version is not None and parse_version(version).release >= parse_version(release).release


def autotuner_supported(version: str | None, surface: ToolSurface | None = None) -> bool:
    """Whether the release reads TLLM_AUTOTUNER_CACHE_PATH: the registry's range (PR #7738: from 1.1), and past its
    evidence (a release the registry marks to be probed) the probe of the installed autotuner's source. Without a
    surface (`plan`) it is rendered and `plan` names it to be probed."""
    name = flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").name
    if not has(ENV, name, version):
        return False
    if version and flag(ENV, name).status(version) == TO_BE_PROBED and surface and surface.env_reads is not None:
        return bool(surface.env_reads.get(name))
    return True


# The PyTorch backend's hardware support matrix (docs/source/features/quantization.md@09d4c79b, "Hardware Support
# Matrix"): W4A16 AWQ is Y on Ampere, Ada Lovelace and Hopper, "." on Blackwell sm100/103 and sm120.
AWQ_MAX_CC = (10, 0)


# The precisions hf_ptq.py's unified export and the PyTorch backend give this lane (validate_options refuses the
# weight-only int8_wo / int4_wo): what its fix hints may offer. The unquantized ones and those with a ModelOpt qformat.
ROUTES = frozenset(p for p, row in PRECISIONS.items() if row.torch_dtype or row.qformat)


# A pre-quantized source (ModelOpt's unified HF export: hf_quant_config.json, or an inline `quantization_config` with
# quant_method modelopt; build.quantized_source) is not quantized again: the PyTorch backend loads it as it is and
# reads its quantization from those files, so nothing is converted and the runtime YAML carries no quantization key.
# Evidence: trtllm_flags.REF_PREQUANTIZED (docs/trtllm-compat.md "Pre-quantized sources").
PREQUANTIZED_EVIDENCE = "TensorRT-LLM ≥ 1.0 docs features/quantization.md 'Running Pre-quantized Models'"


def prequantized_passthrough(variant: Variant, source_dir: Path, quant: SourceQuantization) -> ConvertResult:
    """The pre-quantized source as the unit's checkpoint (no hf_ptq.py run); InputError where the variant's precision
    is not the checkpoint's (preflight refuses it before any download: build.quantized_source.precision_problems)."""
    if quant.precision is not variant.precision:
        raise InputError(f"variants[{variant.name}].precision {variant.precision.value} contradicts the source's "
                         f"quantization {quant.label()}: set it to {quant.precision.value}")
    return ConvertResult(checkpoint_dir=str(source_dir), params={
        "format": "hf-modelopt", "precision": variant.precision.value, "passthrough": True,
        "prequantized": quant.key_json(), "quant_algo": quant.quant_algo,
        "kv_cache_quant_algo": quant.kv_cache_quant_algo})


def awq_check(unit: Unit) -> Check | None:
    """int4_awq (W4A16 AWQ) on a Blackwell target: refused, with the matrix as the reason."""
    cc = unit.target.arch.compute_capability
    if unit.variant.precision is not Precision.INT4_AWQ or cc is None or cc < AWQ_MAX_CC:
        return None
    instead = " / ".join(precision_alternatives(cc, ROUTES, AWQ_MAX_CC, besides=Precision.INT4_AWQ))
    return Check(name="precision_arch", ok=False,
                 message=f"int4_awq (W4A16 AWQ) on {unit.target.arch.value}: the PyTorch backend's hardware support "
                         "matrix has it on Ampere, Ada and Hopper only (docs/source/features/quantization.md)",
                 fix=f"use {instead} on {unit.target.arch.value}, or restrict this variant to sm80–sm90 targets "
                     "(variants[].targets)")


class TrtllmLane(TrtllmLaneBase):
    name = "trtllm"
    convert_tools = (HF_PTQ,)
    # hf_ptq.py's unified export (W4A16_AWQ, FP8, NVFP4): each unit's reference is its own export dequantized, an
    # FP8/NVFP4 one with each linear's input quantized as the engine quantizes it (inputs/dequantize.py); one whose
    # KV cache is quantized too (kv_cache_dtype fp8) keeps the source reference (smoke/simulated.py export_problem).
    dequantizable = frozenset({"int4_awq", "fp8", "nvfp4"})
    fp8_kv_on_ampere = True  # PyTorch-backend support matrix: FP8 KV = Y on Ampere (facts §0)
    precision_routes = ROUTES
    awq_max_cc = AWQ_MAX_CC
    speculative_algorithms = frozenset(a.value for a in SpecAlgorithm)  # the four speculative_config classes
    serves_twin_apart = True  # the same checkpoint from TWIN_CONFIG (trtllm-serve has no per-request switch)
    moe_parallel = True  # moe_expert_parallel_size, moe_tensor_parallel_size, enable_attention_dp
    disaggregated = True  # trtllm-serve disaggregated (enginefoundry.lanes.trtllm_disagg)
    # model.adapters: merge mode converts the merged checkpoint like any other; serve mode writes lora_config
    # (enginefoundry/lanes/lora.py). LoraConfig.max_lora_rank is an int without an upper bound (REF_LORA_CONFIG): the
    # YAML writes the spec's model.max_lora_rank, whose own bound (1024) is the lane's.
    max_lora_rank = 1024

    def adapter_request(self, spec: BuildSpec, name: str) -> dict[str, JsonValue] | None:
        # trtllm-serve picks the adapter by the body's lora_request, `model` the base's (REF_LORA_SERVE_DOC,
        # REF_LORA_REQUEST)
        return lora.adapter_request(spec, name)

    def options(self, spec: BuildSpec) -> TrtllmOptions:
        return trtllm_options(spec.lane_options)

    def registry_checks(self, spec: BuildSpec, unit: Unit) -> list[Check]:
        """The flag registry's word (TrtllmLaneBase), and for a disaggregated unit its router and transceiver keys
        past their evidence (enginefoundry.lanes.trtllm_disagg's registry), named in the same to-be-probed line."""
        out = super().registry_checks(spec, unit)
        d, version = unit.variant.disaggregated, spec.toolchain.trtllm_version
        if d is None or not version:
            return out
        try:
            extra = trtllm_disagg.own_labels(
                trtllm_disagg.disaggregated_serving(d, version, spec.model.name, isl=0, osl=0).to_be_probed)
        except SpecError:  # refused at validate, with the field and the fix
            return out
        if not extra:
            return out
        known = [c for c in out if c.name == PROBE_CHECK and c.ok]
        line = known[0].message + ", " if known else f"to be probed on the worker (no evidence read for {version}): "
        return [c for c in out if c not in known] + [Check(name=PROBE_CHECK, ok=True, message=line + ", ".join(extra))]

    def preflight_checks(self, spec: BuildSpec, unit: Unit, shape: ModelShape | None) -> list[Check]:
        checks = [(awq_check(unit) or c) if c.name == "precision_arch" else c
                  for c in precision_checks(unit, self.fp8_kv_on_ampere, self.precision_routes, self.awq_max_cc)]
        return checks + chunked_prefill_check(unit, None) + self.registry_checks(spec, unit)

    def build_footprint(self, spec: BuildSpec, unit: Unit, est: WeightsEstimate, source_bytes: int,
                        per_rank_bytes: int) -> tuple[float, float]:
        # Quantization loads the whole HF model; otherwise (a pre-quantized source too) each rank loads its shard.
        quantized = unit.variant.precision.is_quantized and spec_quantization(spec) is None
        host = source_bytes if quantized else per_rank_bytes
        return host, source_bytes + (est.weights_bytes_total if quantized else 0)

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        problems = super().validate_options(spec)
        if spec.speculative is not None:
            found = lookup(spec)  # config.json without a download: a local source, model-configs/, the Hub cache
            problems += speculation.spec_problems(spec, spec.toolchain.trtllm_version, found.config,
                                                  found.source or "the model's config.json")
        problems += moe_parallel.variant_problems(spec)  # moe_tp × moe_ep = tp, attention DP needs tp ≥ 2
        problems += trtllm_disagg.variant_problems(spec)  # each role's shape, the release's keys
        problems += lora.release_problems(spec, spec.toolchain.trtllm_version) + lora.module_problems(spec)
        if spec.model.serves_adapters and self.options(spec).triton:
            problems.append(("lane_options.triton", "the LLM API Triton model has no per-request LoRA selection in "
                                                    "the evidence read (model.py reads no lora_request): set "
                                                    "lane_options.triton: false, or use adapter_mode: merge"))
        if self.options(spec).triton:
            why = triton_image_problem(spec.toolchain.trtllm_version, spec.toolchain.image)
            if why:
                problems.append(("lane_options.triton", why))
        for i, v in enumerate(spec.variants):
            if v.precision is Precision.INT4_WO:
                problems.append((f"variants.{i}.precision",
                                 "int4_wo has no ModelOpt unified-HF export; use int4_awq (or lane trtllm-engine)"))
            if v.precision is Precision.INT8_WO:
                problems.append((f"variants.{i}.precision",
                                 "int8_wo (W8A16) is not in the PyTorch backend's quantization support matrix "
                                 "(docs/source/features/quantization.md); use fp8 (sm89+), int4_awq, or lane "
                                 "trtllm-engine"))
            if v.kv_cache_dtype is KVCacheDtype.INT8:
                problems.append((f"variants.{i}.kv_cache_dtype",
                                 "the PyTorch backend's kv_cache_config.dtype is auto or fp8; use fp8 or "
                                 "lane trtllm-engine (--int8_kv_cache)"))
            if v.kv_cache_dtype in (KVCacheDtype.FP16, KVCacheDtype.BF16):
                model = TORCH_DTYPE.get(v.precision)
                want = {"float16": KVCacheDtype.FP16, "bfloat16": KVCacheDtype.BF16}.get(model or "")
                if want is not v.kv_cache_dtype:
                    problems.append((f"variants.{i}.kv_cache_dtype",
                                     f"a {v.kv_cache_dtype.value} KV cache is only the model's own dtype here: "
                                     "use auto, or fp8"))
        return problems

    def tool_commands(self, spec: BuildSpec | None) -> dict[str, list[str]]:
        tools = {SERVE: ["trtllm-serve"]}
        if spec and any(v.disaggregated for v in [*spec.variants, *(u.variant for u in spec.searched)]):
            tools[trtllm_disagg.ROUTER_CMD] = ["trtllm-serve", "disaggregated"]
        opts = trtllm_options(spec.lane_options if spec else None)
        root = opts.modelopt_dir or EnvSettings.read().modelopt_dir
        # A pre-quantized source needs no quantizer on the worker: its checkpoint is served as it is.
        if root and spec and any(v.precision.is_quantized for v in spec.variants) and spec_quantization(spec) is None:
            tools[HF_PTQ] = [self.python, str(hf_ptq_script(root, None))]
        triton = self.triton_dir(spec)
        if triton is not None:
            tools[LAUNCH_TRITON] = [self.python, str(triton / triton_llmapi.LAUNCH)]
        return tools

    def triton_dir(self, spec: BuildSpec | None) -> Path | None:
        """The Triton backend tree, when the spec asks for a Triton repository (lane option triton)."""
        opts = trtllm_options(spec.lane_options if spec else None)
        return Path(opts.triton_dir) if opts.triton else None

    # convert ------------------------------------------------------------------------------------------------

    def convert(self, spec: BuildSpec, variant: Variant, source_dir: Path, workdir: Path) -> ConvertResult:
        quant = read_quantization(source_dir)
        if quant is not None:
            return prequantized_passthrough(variant, source_dir, quant)
        if not variant.precision.is_quantized:
            # The PyTorch backend loads the HF checkpoint directly: nothing to convert.
            return ConvertResult(checkpoint_dir=str(source_dir),
                                 params={"format": "hf", "precision": variant.precision.value, "passthrough": True})
        opts = self.options(spec)
        root = opts.modelopt_dir or EnvSettings.read().modelopt_dir
        surface = self.pinned_surface(spec)
        script = hf_ptq_script(root, surface.modelopt) if root else None
        if script is None or not script.is_file():
            raise ToolError(
                f"quantizing to {variant.precision.value} needs Model-Optimizer's hf_ptq.py; "
                f"{'it is not at ' + str(script) if script else 'none is configured'}: clone NVIDIA/Model-Optimizer "
                "at the tag of the installed nvidia-modelopt and set lane option modelopt_dir or "
                f"${MODELOPT_ENV} to the checkout"
            )
        out = workdir / "checkpoint"
        if out.exists():
            shutil.rmtree(out)
        cmd = quantize_command(spec, variant, source_dir, out, self.python, surface.modelopt)
        check_against_surface([cmd], surface)  # before the calibration's GPU time
        run = run_tool(cmd.argv, workdir / "logs" / "quantize.log", timeout_s=QUANTIZE_TIMEOUT_S,
                       cwd=workdir, what="ModelOpt quantization")
        qcfg_path = out / "hf_quant_config.json"
        if not qcfg_path.is_file() or not (out / "config.json").is_file():
            raise ToolError(f"ModelOpt finished but {out} has no hf_quant_config.json/config.json; log "
                            f"{run.log_path}")
        qcfg = json.loads(qcfg_path.read_text())
        quant = qcfg.get("quantization", qcfg)
        calib = variant.calibration
        params = {
            "format": "hf-modelopt", "precision": variant.precision.value, "qformat": QFORMATS[variant.precision],
            "kv_cache_dtype": variant.kv_cache_dtype.value,
            "quant_algo": quant.get("quant_algo"), "kv_cache_quant_algo": quant.get("kv_cache_quant_algo"),
            "calibration_dataset": calib.dataset if calib else None,
            "calibration_samples": calib.samples if calib else None,
            "calibration_max_seq_length": calib.max_seq_length if calib else None,
            "modelopt": surface.modelopt,
        }
        return ConvertResult(checkpoint_dir=str(out), params=params, commands=[cmd])

    # build --------------------------------------------------------------------------------------------------

    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path,
              draft_dir: Path | None = None, adapter_dirs: dict[str, Path] | None = None) -> BuildResult:
        """Runtime YAML + warm-up on a GPU of the target (autotuner cache) + bundle.json."""
        versions = self.versions()
        self.refuse_speculation(spec, checkpoint_dir, draft_dir)
        self.refuse_adapters(spec, adapter_dirs)
        surface = self.refuse_unsupported(spec, unit)
        logs = workdir / "logs"
        gpus, gpu_env = self.select_gpus(unit, logs)
        opts = self.options(spec)
        bundle = fresh_dir(workdir / "bundle")
        draft = bundle_draft(bundle, draft_dir if spec.speculative is not None else None)
        adapters = lora.bundle_adapters(bundle, adapter_dirs if spec.model.serves_adapters else None)
        cfg = runtime_config(spec, unit, surface.tensorrt_llm, draft)
        disagg = self.disaggregated_files(spec, unit, checkpoint_dir, bundle, surface.tensorrt_llm)
        if disagg is None:
            write_runtime_configs(bundle, cfg)
        script = workdir / "warmup.py"
        script.write_text(WARMUP_SCRIPT)
        # A disaggregated unit's roles differ in parallelism: no one autotuner cache serves both.
        use_cache = opts.autotuner_cache and autotuner_supported(surface.tensorrt_llm, surface) and disagg is None
        cache = bundle / AUTOTUNER_CACHE if use_cache else None
        cwd = warmup_folder(workdir, bundle, draft, lora.BUNDLE_ADAPTERS_DIR if adapters else None)
        warmups = [self._warm_up(script, checkpoint_dir, bundle / name, cache, opts.warmup_requests, gpu_env, cwd,
                                 logs / (f"warmup-{role}.log" if disagg else "warmup.log"))
                   for role, name in (disagg.roles if disagg else {"": RUNTIME_CONFIG}).items()]
        cache_info = None
        files = autotuner_cache_files(bundle) if cache is not None else []
        if files:
            cache_info = AutotunerCache(file=AUTOTUNER_CACHE, files=[p.name for p in files],
                                        tensorrt_llm=versions.get("tensorrt_llm"), gpu_name=gpus[0].name,
                                        compute_capability=gpus[0].compute_capability)
        params = {"runtime_config": cfg, "precision": unit.variant.precision.value,
                  "kv_cache_dtype": unit.variant.kv_cache_dtype.value, **({"draft": draft} if draft else {}),
                  **({"adapters": adapters} if adapters else {})}
        triton_info, triton_cmds = self._triton_repository(opts, bundle, checkpoint_dir, cfg)
        lane_info = BundleInfo(checkpoint=CheckpointRef(path=str(Path(checkpoint_dir).resolve())),
                               runtime_config=RUNTIME_CONFIG, autotuner_cache=cache_info,
                               serve=ServeSettings(health="/health", yaml_flag=serve_yaml_flag(surface)))
        if triton_info:
            # the key only when there is one
            lane_info = lane_info.model_copy(update={"triton": triton_info})
        if disagg is not None:
            lane_info = BundleInfo(checkpoint=lane_info.checkpoint, disaggregated=disagg,
                                   serve=ServeSettings(health="/health"))
        self.write_bundle_info(bundle, unit, params, gpus, versions, lane_info)
        metrics = {"warmup_load_s": round(sum(w.load_s for w in warmups), 3),
                   "warmup_generate_s": round(sum(w.generate_s for w in warmups), 3),
                   "warmup_wall_s": round(sum(w.run.wall_s for w in warmups), 3),
                   "peak_host_rss_mb": round(max(w.run.peak_rss_mb for w in warmups), 1)}
        device = {"gpus": [g.facts() for g in gpus], "autotuner_cache": bool(cache_info), **host_facts()}
        return BuildResult(bundle_dir=str(bundle), params=params, device=device,
                           commands=[*(w.command for w in warmups), *triton_cmds], metrics=metrics)

    def _warm_up(self, script: Path, checkpoint_dir: Path, config: Path, cache: Path | None, requests: int,
                 gpu_env: dict[str, str], cwd: Path, log: Path) -> WarmUp:
        """Load the checkpoint with one runtime YAML and run requests (filling the autotuner cache when given)."""
        keys = llm_api_key_paths(yaml.safe_load(config.read_text()) or {})
        cmd = warmup_command(self.python, script, checkpoint_dir, config, cache, requests, env=gpu_env,
                             llm_api_keys=keys)
        run = run_tool(cmd.argv, log, timeout_s=WARMUP_TIMEOUT_S, env=cmd.env, cwd=cwd, what="TensorRT-LLM warm-up")
        result = parse_marker_json(Path(run.log_path).read_text(errors="replace"), WARMUP_MARKER, "warm-up")
        return WarmUp(command=cmd, load_s=float(result.get("load_s", 0.0)),
                      generate_s=float(result.get("generate_s", 0.0)), run=run)

    def disaggregated_files(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, bundle: Path,
                             release: str | None) -> DisaggSettings | None:
        """A disaggregated unit's serving files in the bundle (trtllm_disagg.bundle_files), for the installed
        release; None for an aggregated unit."""
        d = unit.variant.disaggregated
        if d is None:
            return None
        p, opts = unit.profile, self.options(spec)
        serving = trtllm_disagg.disaggregated_serving(
            d, release, str(Path(checkpoint_dir).resolve()), isl=p.max_input_len, osl=p.max_seq_len - p.max_input_len,
            moe=expert_count(read_model_config(checkpoint_dir)) > 0, base=runtime_config(spec, unit, release),
            tokens_per_block=opts.tokens_per_block or trtllm_disagg.DEFAULT_TOKENS_PER_BLOCK)
        roles = trtllm_disagg.bundle_files(bundle, serving)
        return DisaggSettings(launcher=trtllm_disagg.LAUNCHER, plan=trtllm_disagg.LAUNCH_PLAN,
                              router=trtllm_disagg.ROUTER_FILE, roles=roles)

    def refuse_speculation(self, spec: BuildSpec, checkpoint_dir: Path, draft_dir: Path | None) -> None:
        """Before any GPU time: the speculative section against the fetched checkpoints' own config.json (a Hub
        model whose config was not at hand at validate is checked here), and a draft that must be there."""
        sp = spec.speculative
        if sp is None:
            return
        problems = speculation.model_problems(sp, read_model_config(checkpoint_dir), f"{checkpoint_dir}/config.json")
        if sp.algorithm.needs_draft:
            if draft_dir is None or not Path(draft_dir).is_dir():
                problems.append(("speculative.draft", f"{sp.algorithm.value} needs the fetched draft checkpoint and "
                                                      "none was given to the build: run the unit through the "
                                                      "pipeline, which fetches speculative.draft"))
            else:
                problems += speculation.draft_problems(spec, read_model_config(checkpoint_dir),
                                                       read_model_config(Path(draft_dir)), f"{draft_dir}/config.json")
        if problems:
            raise InputError("; ".join(f"{field}: {msg}" for field, msg in problems))

    def refuse_adapters(self, spec: BuildSpec, adapter_dirs: dict[str, Path] | None) -> None:
        """Before any GPU time: a unit serving adapters needs every fetched adapter folder."""
        if not spec.model.serves_adapters:
            return
        missing = [a.name for a in spec.model.adapters if not (adapter_dirs and adapter_dirs.get(a.name)
                                                               and Path(adapter_dirs[a.name]).is_dir())]
        if missing:
            raise InputError(f"model.adapters: the fetched adapters {missing} were not given to the build: run the "
                             "unit through the pipeline, which fetches model.adapters")

    def _triton_repository(self, opts: TrtllmOptions, bundle: Path, checkpoint_dir: Path,
                           cfg: TrtllmConfig,
                           ) -> tuple[TritonSettings | None, list[Command]]:
        """With lane option triton: the LLM API Triton model under <bundle>/triton_model_repo (its model.yaml names
        the checkpoint as the serving container sees it) and the launch command, for bundle.json."""
        if not opts.triton:
            return None, []
        mount = opts.triton_bundle_mount
        model = f"{mount}/checkpoint" if mount else str(Path(checkpoint_dir).resolve())
        body = triton_llmapi.model_yaml(cfg, model, opts.triton_decoupled_mode)
        triton_llmapi.build_repository(opts.triton_dir, bundle / triton_llmapi.REPO, body)
        repo = f"{mount or bundle.resolve()}/{triton_llmapi.REPO}"
        launch = triton_llmapi.launch_command(opts.triton_dir, repo, llm_api_key_paths(cfg))
        info = TritonSettings(model_repo=triton_llmapi.REPO, model=triton_llmapi.MODEL, checkpoint=model,
                              bundle_mount=mount, launch=launch.argv)
        return info, [launch]

    # serve --------------------------------------------------------------------------------------------------

    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        return self._serve_command(bundle_dir, host, port)

    def twin_serve_command(self, bundle_dir: Path, host: str, port: int, model_name: str) -> ServeCommand | None:
        """The speculative unit's twin: trtllm-serve of the same checkpoint with the bundle's TWIN_CONFIG (the
        runtime YAML less speculative_config, written by the build); None for a bundle without one."""
        if not (Path(bundle_dir) / TWIN_CONFIG).is_file():
            return None
        return self._serve_command(bundle_dir, host, port, TWIN_CONFIG)

    def _serve_command(self, bundle_dir: Path, host: str, port: int, config: str | None = None) -> ServeCommand:
        info = read_bundle_info(bundle_dir)
        checkpoint = bundle_checkpoint(Path(bundle_dir), info)
        if info.disaggregated is not None and config is None:
            return self._disaggregated_serve_command(Path(bundle_dir), info.disaggregated, checkpoint, host, port)
        env = {}
        copies = {}
        cache = usable_autotuner_cache(Path(bundle_dir), info)
        if cache is not None:
            # A private copy in the server's working folder (TensorRT-LLM saves back into the file it loads): made
            # by whoever starts the server, removed with that folder; the published serve.sh makes its own.
            name, files = cache
            copies = {f.name: str(f) for f in files}
            env[flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").name] = f"${{{SERVE_CWD_VAR}}}/{name}"
        yaml_flag = info.serve.yaml_flag or "extra_llm_api_options"
        if yaml_flag not in YAML_FLAGS:  # bundle.json is outside input: never turn it into an arbitrary flag
            raise ToolError(f"{Path(bundle_dir) / BUNDLE_INFO}: serve.yaml_flag {yaml_flag!r} is not one of "
                            f"{', '.join(YAML_FLAGS)}: rebuild the bundle")
        if not info.runtime_config:
            raise InputError(f"{Path(bundle_dir) / BUNDLE_INFO} names no runtime_config: not a bundle of lane "
                             f"{self.name}; serve it with the lane that built it, or rebuild it")
        links = {}
        draft = info.params.get("draft")  # JSON edge: the recorded params
        if draft is not None:  # the YAML names the bundled draft relative to the server's working folder
            name = check_name(str(draft), "bundle.json params.draft")
            if not (Path(bundle_dir) / name).is_dir():
                raise InputError(f"{Path(bundle_dir) / BUNDLE_INFO}: params.draft {name!r} is not a folder of the "
                                 "bundle: rebuild it")
            links[name] = str((Path(bundle_dir) / name).resolve())
        if lora.bundled_adapters(Path(bundle_dir), info):  # the YAML and each request name them relative to the cwd
            links[lora.BUNDLE_ADAPTERS_DIR] = str((Path(bundle_dir) / lora.BUNDLE_ADAPTERS_DIR).resolve())
        argv = serve_argv(checkpoint, Path(bundle_dir).resolve() / (config or info.runtime_config), host, port,
                          yaml_flag)
        what = "trtllm-serve (PyTorch backend)" + (", the non-speculative twin" if config else "") + (
            ", the base + LoRA adapters (lora_config; each request's lora_request)" if links.get(
                lora.BUNDLE_ADAPTERS_DIR) else "")
        return ServeCommand(command=Command(argv=argv, env=env, description=what),
                            model_name=str(checkpoint), health_path="/health", tokenizer_dir=str(checkpoint),
                            copies=copies, links=links)

    def _disaggregated_serve_command(self, bundle: Path, settings: DisaggSettings, checkpoint: Path, host: str,
                                     port: int) -> ServeCommand:
        """A disaggregated unit's server: the bundle's launcher, which starts each worker and then the router on
        HOST:PORT (enginefoundry.lanes.disagg_launch); the smoke gate and the benchmark talk to the router. Its
        working folder (a link to the bundle in it) holds the workers' logs and the router's config."""
        launcher = bundle / check_name(settings.launcher, "bundle.json disaggregated.launcher")
        plan = bundle / check_name(settings.plan, "bundle.json disaggregated.plan")
        if not launcher.is_file() or not plan.is_file():
            raise InputError(f"{bundle / BUNDLE_INFO}: the launcher {settings.launcher} or its plan {settings.plan} "
                             "is not in the bundle: rebuild it")
        argv = [self.python, str(launcher.resolve()), "--checkpoint", str(checkpoint), "--host", host,
                "--port", str(port), "--serve", "trtllm-serve"]
        roles = ", ".join(f"{r}: {n}" for r, n in settings.roles.items())
        return ServeCommand(command=Command(argv=argv, description=f"trtllm-serve disaggregated: its workers ({roles}) "
                                                                   "and the router"),
                            model_name=str(checkpoint), health_path="/health", tokenizer_dir=str(checkpoint),
                            links={"bundle": str(bundle.resolve())})

    def describe(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None = None) -> list[Command]:
        if unit.variant.disaggregated is not None:
            return self._describe_disaggregated(spec, unit, surface)
        version = surface.tensorrt_llm if surface else spec.toolchain.trtllm_version
        modelopt = surface.modelopt if surface else assumed_modelopt(spec.toolchain.trtllm_version)
        cmds = []
        ckpt = "<source checkpoint>"
        quant = spec_quantization(spec)  # a pre-quantized source whose files are here (no download)
        if quant is not None:
            cmds.append(Command(argv=["(none)", f"the source is pre-quantized: {quant.label()}; trtllm-serve loads it "
                                      f"as it is ({PREQUANTIZED_EVIDENCE})"], description="convert (no PTQ)"))
        elif unit.variant.precision.is_quantized:
            cmds.append(quantize_command(spec, unit.variant, "<source checkpoint>", "<work>/checkpoint",
                                         WORKER_PYTHON, modelopt))
            ckpt = "<work>/checkpoint"
        opts = self.options(spec)
        keys = llm_api_key_paths(runtime_config(spec, unit, version))
        use_cache = opts.autotuner_cache and autotuner_supported(version, surface)
        cache = f"<bundle>/{AUTOTUNER_CACHE}" if use_cache else None
        cmds.append(warmup_command(WORKER_PYTHON, "<work>/warmup.py", ckpt, f"<bundle>/{RUNTIME_CONFIG}", cache,
                                   opts.warmup_requests, llm_api_keys=keys))
        cmds.append(Command(argv=serve_argv(ckpt, f"<bundle>/{RUNTIME_CONFIG}", "127.0.0.1", 8000,
                                             serve_yaml_flag(surface)),
                            tool=SERVE, llm_api_keys=keys, description="serve" + (
                                f": the base + {len(spec.model.adapters)} LoRA adapters (lora_config), each request "
                                "selecting one by its lora_request" if spec.model.serves_adapters else "")))
        if opts.triton:
            cmds.append(triton_llmapi.launch_command(opts.triton_dir, f"<bundle>/{triton_llmapi.REPO}", keys,
                                                     WORKER_PYTHON))
        return cmds


    def _describe_disaggregated(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None) -> list[Command]:
        """A disaggregated unit's work: the quantization (if any), a warm-up per role, each worker's trtllm-serve
        with its role's YAML keys and the router's `trtllm-serve disaggregated --config_file`: what `plan` shows and
        what the worker's probe checks before any GPU time."""
        d = unit.variant.disaggregated
        assert d is not None
        version = surface.tensorrt_llm if surface else spec.toolchain.trtllm_version
        quantized = unit.variant.precision.is_quantized and spec_quantization(spec) is None
        ckpt = "<work>/checkpoint" if quantized else "<source checkpoint>"
        cmds = [quantize_command(spec, unit.variant, "<source checkpoint>", ckpt, WORKER_PYTHON,
                                 surface.modelopt if surface else assumed_modelopt(version))] if quantized else []
        p = unit.profile
        serving = trtllm_disagg.disaggregated_serving(
            d, version, ckpt, isl=p.max_input_len, osl=p.max_seq_len - p.max_input_len,
            base=runtime_config(spec, unit, version),
            tokens_per_block=self.options(spec).tokens_per_block or trtllm_disagg.DEFAULT_TOKENS_PER_BLOCK)
        for role, name in trtllm_disagg.ROLE_FILES.items():
            keys = llm_api_key_paths(serving.roles[role])
            cmds.append(warmup_command(WORKER_PYTHON, "<work>/warmup.py", ckpt, f"<bundle>/{name}", None,
                                       self.options(spec).warmup_requests, llm_api_keys=keys))
        for argv in serving.commands[:-1]:
            name = argv[-1]
            keys = llm_api_key_paths(serving.roles["context" if name == trtllm_disagg.ROLE_FILES["context"]
                                                   else "generation"])
            cmds.append(Command(argv=[*argv[:-1], f"<bundle>/{name}"], tool=SERVE, llm_api_keys=keys,
                                description=f"serve: a {name.split('.')[0]} worker"))
        router = serving.commands[-1]
        cmds.append(Command(argv=[*router[:-1], f"<bundle>/{router[-1]}"], tool=trtllm_disagg.ROUTER_CMD,
                            description="serve: the router (the unit's endpoint), after every worker is healthy"))
        return cmds


def bundle_checkpoint(bundle_dir: Path, info: BundleInfo | Mapping[str, object]) -> Path:
    """The checkpoint a bundle serves: `<bundle>/checkpoint` when the fetch step placed it there, else the
    path recorded at build time."""
    local = bundle_dir / "checkpoint"
    if local.is_dir():
        return local.resolve()
    checkpoint = BundleInfo.of(info, bundle_dir / BUNDLE_INFO).checkpoint
    if checkpoint is None:
        raise InputError(f"{bundle_dir / BUNDLE_INFO} records no checkpoint: not a bundle of lane trtllm; rebuild it")
    recorded = Path(checkpoint.path)
    if recorded.is_dir():
        return recorded
    raise ToolError(f"bundle {bundle_dir} serves the checkpoint {recorded}, which is not on this host: fetch it to "
                    f"{local}")


def usable_autotuner_cache(bundle_dir: Path, info: BundleInfo | Mapping[str, object],
                           gpus: list[GPUInfo] | None = None, trtllm_version: str | None = None,
                           ) -> tuple[str, list[Path]] | None:
    """The bundle's autotuner cache when it was made by this TensorRT-LLM on this GPU model: the name
    TLLM_AUTOTUNER_CACHE_PATH gives (as at warm-up) and the files to copy beside it under their own names (the
    file itself and/or its <stem>.rank{N}.json siblings).

    TensorRT-LLM loads any cache it is pointed at and saves back into it (facts §1, sparkrun#256): whoever starts
    the server serves a copy (ServeCommand.copies), which keeps the published bundle unchanged, and the checks
    keep a cache from another image or GPU out. The names come from bundle.json, outside input: plain file names
    in the bundle, or the bundle is refused.
    """
    meta = BundleInfo.of(info, bundle_dir / BUNDLE_INFO).autotuner_cache
    if not meta:
        return None
    try:
        name = check_name(meta.file, "bundle.json autotuner_cache.file")
        names = [check_name(n, "bundle.json autotuner_cache.files") for n in
                 (meta.files if meta.files is not None else [meta.file])]
    except UnsafePathError as e:
        raise ToolError(f"{bundle_dir / BUNDLE_INFO}: {e}; rebuild the bundle") from None
    files = [bundle_dir / n for n in names]
    if not files or not all(f.is_file() and not f.is_symlink() for f in files):
        return None
    version = trtllm_version or installed_version("tensorrt-llm") or installed_version("tensorrt_llm")
    if version != meta.tensorrt_llm:
        return None
    if gpus is None:
        try:
            gpus = detect_gpus()
        except ToolError:
            return None
    if not any(g.name == meta.gpu_name for g in gpus):
        return None
    return name, files


def model_activation_dtype(variant: Variant, checkpoint_dir: Path | None, override: str | None) -> str | None:
    """The dtype the model computes in, reading the checkpoint's config.json when it is at hand."""
    return activation_dtype(variant.precision, checkpoint_shape(checkpoint_dir), override)


__all__ = [
    "BUNDLE_INFO",
    "TrtllmLane",
    "TrtllmLaneBase",
    "autotuner_cache_files",
    "bundle_checkpoint",
    "hf_ptq_script",
    "parse_marker_json",
    "quantize_command",
    "runtime_config",
    "serve_argv",
    "usable_autotuner_cache",
    "warmup_command",
]
