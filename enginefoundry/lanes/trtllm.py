"""Lane `trtllm`: TensorRT-LLM ≥ 1.0 on the PyTorch backend (the default since 1.0, PR #5312).

There is no engine. What makes a unit specific to a GPU is (facts §1 "What replaces the per-arch engine"):
1. the checkpoint: the Hugging Face one as is, or a ModelOpt-quantized HF checkpoint (hf_quant_config.json);
2. the runtime config YAML given to `trtllm-serve --extra_llm_api_options` (LLM API args, pydantic
   extra="forbid" upstream, so every key is registered in trtllm_flags);
3. the autotuner profiling cache (TLLM_AUTOTUNER_CACHE_PATH, PR #7738), filled by a warm-up on a GPU of the
   target. TensorRT-LLM records the version and GPU in it but does not check them when loading, so the bundle
   records them and `serve_command` only uses the cache on the same GPU model and TensorRT-LLM version.

Shared pieces of both TensorRT-LLM lanes (toolchain check, GPU selection, bundle.json) live here too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from enginefoundry.devices import host_facts
from enginefoundry.errors import InputError, ToolError
from enginefoundry.gpu import GPUInfo, detect_gpus, match_target
from enginefoundry.lanes.base import BuildResult, Command, ConvertResult, Lane, ServeCommand
from enginefoundry.lanes.trtllm_flags import (
    ENV,
    HF_PTQ,
    SERVE,
    TRTLLM_INSTALL_HINT,
    arg,
    flag,
    lane_release_problem,
    resolve_options,
    unknown_llm_api_keys,
    validate_lane_options,
)
from enginefoundry.plan import Unit
from enginefoundry.preflight import TORCH_DTYPE, activation_dtype
from enginefoundry.runner import run_tool
from enginefoundry.spec import BuildSpec, KVCacheDtype, Precision, Variant
from enginefoundry.toolchain import ToolchainInfo, detect_toolchain, installed_version, require_trtllm

BUNDLE_INFO = "bundle.json"
BUNDLE_FORMAT = 1
RUNTIME_CONFIG = "llm_api_options.yaml"
AUTOTUNER_CACHE = "autotuner.cache"
WARMUP_MARKER = "ENGINEFOUNDRY_WARMUP_JSON "
QUANTIZE_TIMEOUT_S = 6 * 3600.0  # a 70B calibration takes hours (#1331)
WARMUP_TIMEOUT_S = 2 * 3600.0  # MoE tactic profiling costs "a few minutes each time" (facts §1)

# variants[].precision → hf_ptq.py --qformat (ModelOpt unified HF export).
QFORMATS = {Precision.FP8: "fp8", Precision.NVFP4: "nvfp4", Precision.INT4_AWQ: "int4_awq",
            Precision.INT8_WO: "int8_wo"}

# Loads the bundle's YAML exactly as trtllm-serve does (update_llm_args_with_extra_dict turns the nested dicts
# into KvCacheConfig/CudaGraphConfig), generates a few requests so the autotuner profiles, shuts down (the cache is
# saved by then), and prints one JSON line behind a marker: tensorrt_llm prints a banner on stdout.
WARMUP_SCRIPT = f'''"""enginefoundry warm-up: load the checkpoint with the runtime YAML, run requests, shut down."""
import json
import sys
import time

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
print({WARMUP_MARKER!r} + json.dumps({{"load_s": load_s, "generate_s": generate_s, "tokens": tokens}}), flush=True)
'''


# --- shared by both TensorRT-LLM lanes -----------------------------------------------------------------------

class TrtllmLaneBase(Lane):
    """Option validation, the toolchain gate, GPU selection and bundle.json for the TensorRT-LLM lanes."""

    name = "trtllm"
    install_hint = TRTLLM_INSTALL_HINT

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._toolchain: ToolchainInfo | None = None

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        pinned = spec.toolchain.trtllm_version
        problems = validate_lane_options(self.name, spec.lane_options, pinned)
        if pinned:
            why = lane_release_problem(self.name, pinned)
            if why:
                problems.append(("toolchain.trtllm_version", why))
        for i, t in enumerate(spec.targets):
            if t.gpu_count < 1:
                problems.append((f"targets.{i}.gpu_count", f"lane {self.name} needs at least one NVIDIA GPU"))
        for i, p in enumerate(spec.profiles):
            if not p.paged_kv_cache:
                problems.append((f"profiles.{i}.paged_kv_cache",
                                 "in-flight batching (trtllm-serve, Triton inflight_fused_batching) needs the paged "
                                 "KV cache: remove the field or set it to true"))
            if not p.remove_input_padding:
                problems.append((f"profiles.{i}.remove_input_padding",
                                 "in-flight batching needs packed input (remove_input_padding): remove the field or "
                                 "set it to true"))
        return problems

    def options(self, spec: BuildSpec) -> dict[str, Any]:
        return resolve_options(self.name, spec.lane_options)

    def toolchain(self) -> ToolchainInfo:
        if self._toolchain is None:
            self._toolchain = detect_toolchain(self.python)
        return self._toolchain

    def versions(self) -> dict[str, str]:
        info = self.toolchain()
        version = require_trtllm(info, self.name, self.install_hint)
        why = lane_release_problem(self.name, str(version))
        if why:
            raise ToolError(why)
        return info.versions()

    def select_gpus(self, unit: Unit, log_dir: Path) -> tuple[list[GPUInfo], dict[str, str]]:
        """The target's GPUs on this host and the env that pins the tool to them (PreflightError otherwise)."""
        used = match_target(unit.target, detect_gpus(log_dir))
        # CUDA enumerates fastest-first, nvidia-smi by PCI bus: name the GPUs by UUID, or by bus order.
        if all(g.uuid for g in used):
            env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g.uuid) for g in used)}
        else:
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in used)}
        return used, env

    def write_bundle_info(self, bundle: Path, unit: Unit, params: dict[str, Any], gpus: list[GPUInfo],
                          versions: dict[str, str], extra: dict[str, Any]) -> dict[str, Any]:
        # TensorRT-LLM writes no GPU, SM or TensorRT version into its artifacts (facts §5): record them here.
        info = {"format": BUNDLE_FORMAT, "lane": self.name, "unit": unit.name, "params": params,
                "versions": versions, "gpus": [g.facts() for g in gpus], "host": host_facts(), **extra}
        (bundle / BUNDLE_INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
        return info


def read_bundle_info(bundle_dir: Path) -> dict[str, Any]:
    path = Path(bundle_dir) / BUNDLE_INFO
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path} does not exist: {bundle_dir} is not a bundle built by enginefoundry") from None


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def parse_marker_json(text: str, marker: str, what: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        idx = line.find(marker)
        if idx >= 0:
            return json.loads(line[idx + len(marker):])
    raise ToolError(f"{what} printed no result line")


# --- lane trtllm ---------------------------------------------------------------------------------------------

def kv_cache_dtype_key(variant: Variant) -> str | None:
    """kv_cache_config.dtype for the variant: "fp8" or None (auto: the model's dtype)."""
    return "fp8" if variant.kv_cache_dtype is KVCacheDtype.FP8 else None


def runtime_config(spec: BuildSpec, unit: Unit) -> dict[str, Any]:
    """The LLM API YAML for `trtllm-serve --extra_llm_api_options` (and the warm-up)."""
    opts = resolve_options("trtllm", spec.lane_options)
    v, p = unit.variant, unit.profile
    kv: dict[str, Any] = {"free_gpu_memory_fraction": p.kv_cache_free_gpu_memory_fraction}
    if kv_cache_dtype_key(v):
        kv["dtype"] = kv_cache_dtype_key(v)
    if opts["enable_block_reuse"] is not None:
        kv["enable_block_reuse"] = opts["enable_block_reuse"]
    if opts["tokens_per_block"] is not None:
        kv["tokens_per_block"] = opts["tokens_per_block"]
    cfg: dict[str, Any] = {
        "tensor_parallel_size": v.tp,
        "pipeline_parallel_size": v.pp,
        "max_batch_size": p.max_batch_size,
        "max_num_tokens": p.max_num_tokens,
        "max_seq_len": p.max_seq_len,
        "kv_cache_config": kv,
    }
    if v.precision in TORCH_DTYPE:
        # The HF checkpoint passes through unconverted: pin the compute dtype to the variant's.
        cfg["dtype"] = TORCH_DTYPE[v.precision]
    if opts["cuda_graphs"]:
        cap = opts["cuda_graph_max_batch_size"] or p.max_batch_size
        cfg["cuda_graph_config"] = {"enable_padding": bool(opts["cuda_graph_padding"]),
                                    "max_batch_size": min(cap, p.max_batch_size)}
    else:
        cfg["cuda_graph_config"] = None  # null turns CUDA graphs off (the upstream default is on)
    chunked = opts["enable_chunked_prefill"]
    if chunked is None:
        # A prompt longer than max_num_tokens cannot be scheduled in one step without chunked prefill.
        chunked = p.max_input_len > p.max_num_tokens
    if chunked:
        cfg["enable_chunked_prefill"] = True
    bad = unknown_llm_api_keys(cfg)
    if bad:  # a programming error: every key must be registered with its release range
        raise AssertionError(f"runtime config has unregistered LLM API keys {bad}")
    return cfg


def quantize_command(spec: BuildSpec, variant: Variant, source_dir: Path | str, out_dir: Path | str,
                     python: str | None = None) -> Command:
    """ModelOpt PTQ to a unified HF checkpoint (hf_quant_config.json), Model-Optimizer examples/llm_ptq/hf_ptq.py."""
    opts = resolve_options("trtllm", spec.lane_options)
    ptq_dir = opts["modelopt_dir"] or os.environ.get("EF_MODELOPT_LLM_PTQ_DIR") or "$EF_MODELOPT_LLM_PTQ_DIR"
    calib = variant.calibration
    assert calib is not None  # Variant fills a default calibration for quantized precisions
    # hf_ptq.py's KV default changed between releases (fp8, later fp8_cast): always say what the variant wants.
    kv = "fp8" if variant.kv_cache_dtype is KVCacheDtype.FP8 else "none"
    argv = [python or sys.executable, str(Path(ptq_dir) / "hf_ptq.py"),
            arg(HF_PTQ, "pyt_ckpt_path"), str(source_dir),
            arg(HF_PTQ, "qformat"), QFORMATS[variant.precision],
            arg(HF_PTQ, "kv_cache_qformat"), kv,
            arg(HF_PTQ, "dataset"), calib.dataset,
            arg(HF_PTQ, "calib_size"), str(calib.samples),
            arg(HF_PTQ, "calib_seq"), str(calib.max_seq_length),
            arg(HF_PTQ, "export_path"), str(out_dir),
            arg(HF_PTQ, "export_fmt"), "hf"]
    return Command(argv=argv, cwd=str(Path(out_dir).parent),
                   description=f"ModelOpt PTQ {QFORMATS[variant.precision]} → HF checkpoint")


def warmup_command(python: str, script: Path | str, checkpoint: Path | str, config: Path | str,
                   cache: Path | str | None, requests: int, env: dict[str, str] | None = None) -> Command:
    full_env = dict(env or {})
    if cache is not None:
        full_env[flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").name] = str(cache)
    return Command(argv=[python, str(script), str(checkpoint), str(config), str(requests)], env=full_env,
                   description="warm-up: load, run requests, fill the autotuner cache")


def serve_argv(checkpoint: Path | str, config: Path | str, host: str, port: int) -> list[str]:
    # --extra_llm_api_options exists in every 1.x; its alias --config only since Nov 2025 (PR #9104).
    return ["trtllm-serve", str(checkpoint), arg(SERVE, "extra_llm_api_options"), str(config),
            arg(SERVE, "host"), host, arg(SERVE, "port"), str(port)]


class TrtllmLane(TrtllmLaneBase):
    name = "trtllm"

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        problems = super().validate_options(spec)
        for i, v in enumerate(spec.variants):
            if v.precision is Precision.INT4_WO:
                problems.append((f"variants.{i}.precision",
                                 "int4_wo has no ModelOpt unified-HF export; use int4_awq (or lane trtllm-engine)"))
            if v.kv_cache_dtype is KVCacheDtype.INT8:
                problems.append((f"variants.{i}.kv_cache_dtype",
                                 "the PyTorch backend's kv_cache_config.dtype is auto or fp8; use fp8 (sm89+) or "
                                 "lane trtllm-engine (--int8_kv_cache)"))
            if v.kv_cache_dtype in (KVCacheDtype.FP16, KVCacheDtype.BF16):
                model = TORCH_DTYPE.get(v.precision)
                want = {"float16": KVCacheDtype.FP16, "bfloat16": KVCacheDtype.BF16}.get(model or "")
                if want is not v.kv_cache_dtype:
                    problems.append((f"variants.{i}.kv_cache_dtype",
                                     f"a {v.kv_cache_dtype.value} KV cache is only the model's own dtype here: "
                                     "use auto, or fp8"))
        return problems

    # convert ------------------------------------------------------------------------------------------------

    def convert(self, spec: BuildSpec, variant: Variant, source_dir: Path, workdir: Path) -> ConvertResult:
        if not variant.precision.is_quantized:
            # The PyTorch backend loads the HF checkpoint directly: nothing to convert.
            return ConvertResult(checkpoint_dir=str(source_dir),
                                 params={"format": "hf", "precision": variant.precision.value, "passthrough": True})
        opts = self.options(spec)
        ptq_dir = opts["modelopt_dir"] or os.environ.get("EF_MODELOPT_LLM_PTQ_DIR")
        if not ptq_dir or not (Path(ptq_dir) / "hf_ptq.py").is_file():
            raise ToolError(
                f"quantizing to {variant.precision.value} needs Model-Optimizer's examples/llm_ptq/hf_ptq.py; "
                f"{'it is not at ' + str(ptq_dir) if ptq_dir else 'none is configured'}: clone NVIDIA/Model-Optimizer "
                "at the tag of the installed nvidia-modelopt and set lane option modelopt_dir or "
                "$EF_MODELOPT_LLM_PTQ_DIR to its examples/llm_ptq"
            )
        out = workdir / "checkpoint"
        if out.exists():
            shutil.rmtree(out)
        cmd = quantize_command(spec, variant, source_dir, out, self.python)
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
            "modelopt": installed_version("nvidia-modelopt"),
        }
        return ConvertResult(checkpoint_dir=str(out), params=params, commands=[cmd])

    # build --------------------------------------------------------------------------------------------------

    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path) -> BuildResult:
        """Runtime YAML + warm-up on a GPU of the target (autotuner cache) + bundle.json."""
        versions = self.versions()
        logs = workdir / "logs"
        gpus, gpu_env = self.select_gpus(unit, logs)
        opts = self.options(spec)
        bundle = fresh_dir(workdir / "bundle")
        cfg = runtime_config(spec, unit)
        (bundle / RUNTIME_CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
        script = workdir / "warmup.py"
        script.write_text(WARMUP_SCRIPT)
        cache = bundle / AUTOTUNER_CACHE if opts["autotuner_cache"] else None
        cmd = warmup_command(self.python, script, checkpoint_dir, bundle / RUNTIME_CONFIG, cache,
                             opts["warmup_requests"], env=gpu_env)
        run = run_tool(cmd.argv, logs / "warmup.log", timeout_s=WARMUP_TIMEOUT_S, env=cmd.env, cwd=workdir,
                       what="TensorRT-LLM warm-up")
        result = parse_marker_json(Path(run.log_path).read_text(errors="replace"), WARMUP_MARKER, "warm-up")
        cache_info = None
        if cache is not None and cache.is_file() and cache.stat().st_size > 0:
            cache_info = {"file": AUTOTUNER_CACHE, "tensorrt_llm": versions.get("tensorrt_llm"),
                          "gpu_name": gpus[0].name, "compute_capability": gpus[0].compute_capability}
        params = {"runtime_config": cfg, "precision": unit.variant.precision.value,
                  "kv_cache_dtype": unit.variant.kv_cache_dtype.value}
        self.write_bundle_info(bundle, unit, params, gpus, versions, {
            "checkpoint": {"path": str(Path(checkpoint_dir).resolve())},
            "runtime_config": RUNTIME_CONFIG,
            "autotuner_cache": cache_info,
            "serve": {"health": "/health"},
        })
        metrics = {"warmup_load_s": round(float(result.get("load_s", 0.0)), 3),
                   "warmup_generate_s": round(float(result.get("generate_s", 0.0)), 3),
                   "warmup_wall_s": round(run.wall_s, 3), "peak_host_rss_mb": round(run.peak_rss_mb, 1)}
        device = {"gpus": [g.facts() for g in gpus], "autotuner_cache": bool(cache_info), **host_facts()}
        return BuildResult(bundle_dir=str(bundle), params=params, device=device, commands=[cmd], metrics=metrics)

    # serve --------------------------------------------------------------------------------------------------

    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        info = read_bundle_info(bundle_dir)
        checkpoint = bundle_checkpoint(Path(bundle_dir), info)
        env = {}
        cache = usable_autotuner_cache(Path(bundle_dir), info)
        if cache is not None:
            env[flag(ENV, "TLLM_AUTOTUNER_CACHE_PATH").name] = str(cache)
        argv = serve_argv(checkpoint, Path(bundle_dir).resolve() / info["runtime_config"], host, port)
        return ServeCommand(command=Command(argv=argv, env=env, description="trtllm-serve (PyTorch backend)"),
                            model_name=str(checkpoint), health_path="/health", tokenizer_dir=str(checkpoint))

    def describe(self, spec: BuildSpec, unit: Unit) -> list[Command]:
        cmds = []
        ckpt = "<source checkpoint>"
        if unit.variant.precision.is_quantized:
            cmds.append(quantize_command(spec, unit.variant, "<source checkpoint>", "<work>/checkpoint",
                                         self.python))
            ckpt = "<work>/checkpoint"
        opts = self.options(spec)
        cache = f"<bundle>/{AUTOTUNER_CACHE}" if opts["autotuner_cache"] else None
        cmds.append(warmup_command(self.python, "<work>/warmup.py", ckpt, f"<bundle>/{RUNTIME_CONFIG}", cache,
                                   opts["warmup_requests"]))
        cmds.append(Command(argv=serve_argv(ckpt, f"<bundle>/{RUNTIME_CONFIG}", "127.0.0.1", 8000),
                            description="serve"))
        return cmds


def bundle_checkpoint(bundle_dir: Path, info: dict[str, Any]) -> Path:
    """The checkpoint a bundle serves: `<bundle>/checkpoint` when the fetch step placed it there, else the
    path recorded at build time."""
    local = bundle_dir / "checkpoint"
    if local.is_dir():
        return local.resolve()
    recorded = Path(info["checkpoint"]["path"])
    if recorded.is_dir():
        return recorded
    raise ToolError(f"bundle {bundle_dir} serves the checkpoint {recorded}, which is not on this host: fetch it to "
                    f"{local}")


def usable_autotuner_cache(bundle_dir: Path, info: dict[str, Any],
                           gpus: list[GPUInfo] | None = None, trtllm_version: str | None = None) -> Path | None:
    """A scratch copy of the bundle's autotuner cache when it was made by this TensorRT-LLM on this GPU model.

    TensorRT-LLM loads any cache it is pointed at and saves back into it (facts §1, sparkrun#256): the copy keeps
    the published bundle unchanged, and the checks keep a cache from another image or GPU out.
    """
    meta = info.get("autotuner_cache")
    if not meta:
        return None
    src = bundle_dir / meta["file"]
    if not src.is_file():
        return None
    version = trtllm_version or installed_version("tensorrt-llm") or installed_version("tensorrt_llm")
    if version != meta.get("tensorrt_llm"):
        return None
    if gpus is None:
        try:
            gpus = detect_gpus()
        except ToolError:
            return None
    if not any(g.name == meta.get("gpu_name") for g in gpus):
        return None
    scratch = Path(tempfile.mkdtemp(prefix="ef-autotuner-")) / AUTOTUNER_CACHE
    shutil.copyfile(src, scratch)
    return scratch


def model_activation_dtype(variant: Variant, checkpoint_dir: Path | None, override: str | None) -> str | None:
    """The dtype the model computes in, reading the checkpoint's config.json when it is at hand."""
    shape = None
    if checkpoint_dir is not None and (checkpoint_dir / "config.json").is_file():
        from enginefoundry.preflight import ModelShape, read_model_config

        shape = ModelShape.from_config(read_model_config(checkpoint_dir))
    return activation_dtype(variant.precision, shape, override)


__all__ = [
    "TrtllmLane", "TrtllmLaneBase", "bundle_checkpoint", "quantize_command", "runtime_config",
    "serve_argv", "usable_autotuner_cache", "warmup_command",
]
