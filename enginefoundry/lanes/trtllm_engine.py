"""Lane `trtllm-engine`: the legacy TensorRT-engine path, TensorRT-LLM 1.0 – 1.2.x only.

convert: parallelism and quantization are fixed here, in the checkpoint's `mapping`. Plain dtypes, weight-only
int8/int4 and an INT8 KV cache go through the family's `convert_checkpoint.py`; fp8, nvfp4, int4_awq and an FP8
KV cache go through `examples/quantization/quantize.py --qformat … --kv_cache_dtype … --calib_size …` (ModelOpt
PTQ: convert_checkpoint.py says "AWQ is only supported by quantize.py script", facts §0).
build: `trtllm-build` on a GPU of the target → `rank{N}.engine` + `config.json`, plus a Triton
`inflight_batcher_llm` model repository; serve: `trtllm-serve <engine> --backend trt|tensorrt --tokenizer <hf>`
(`trt` in 1.0.x, `tensorrt` after PR #7829; read from the installed `--help`).
TensorRT-LLM 1.3 removes all of it (#15763, #15907, #15918, #16369): `versions()` refuses 1.3 and its rcs.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from enginefoundry.catalog.precisions import PRECISIONS
from enginefoundry.errors import InputError, ToolError, first_problem
from enginefoundry.gpu.precisions import SAME_KV_DTYPE, TORCH_DTYPE, activation_dtype
from enginefoundry.identity import TOKENIZER_FILES
from enginefoundry.inputs.model_shape import Check, ModelShape, read_model_config
from enginefoundry.inputs.toolchain import ToolHelp, ToolSurface, check_against_surface
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes import triton
from enginefoundry.lanes.base import (
    BUNDLE_INFO,
    BuildResult,
    BundleInfo,
    Command,
    ConvertResult,
    ServeCommand,
    ServeSettings,
    TritonSettings,
    WeightsEstimate,
)
from enginefoundry.lanes.moe_parallel import unsupported_problems
from enginefoundry.lanes.trtllm import model_activation_dtype
from enginefoundry.lanes.trtllm_base import (
    WORKER_PYTHON,
    TrtllmLaneBase,
    chunked_prefill_check,
    fresh_dir,
    json_object,
    precision_checks,
    read_bundle_info,
)
from enginefoundry.lanes.trtllm_flags import (
    CONVERT,
    ENGINE_INSTALL_HINT,
    FILL,
    QUANTIZE,
    SERVE,
    TRTLLM_BUILD,
    arg,
    lane_release_problem,
    serve_backend_value,
)
from enginefoundry.lanes.trtllm_options import EngineOptions, engine_options
from enginefoundry.runner import run_tool
from enginefoundry.schemas.loose import HfModelConfig, TrtllmConfig
from enginefoundry.settings import EnvSettings
from enginefoundry.spec import BuildSpec, KVCacheDtype, Variant

CONVERT_TIMEOUT_S = 6 * 3600.0
BUILD_TIMEOUT_S = 4 * 3600.0  # 30–90 min for 70B (facts §12), with room for a slow host
ENGINE_DIR = "engine"
TOKENIZER_DIR = "tokenizer"
TRITON_REPO = "triton_model_repo"
# Small files that let AutoTokenizer load from the tokenizer folder alone.
TOKENIZER_EXTRA = ("config.json", "generation_config.json")

# config.json `architectures[0]` / `model_type` → the examples/models/core/<dir> whose convert_checkpoint.py
# handles it. Llama first; other families need their own script and flags.
FAMILIES = {"LlamaForCausalLM": "llama", "llama": "llama"}
# convert_checkpoint.py --weight_only_precision, and the precisions quantize.py produces (ModelOpt PTQ with
# calibration) by --qformat: the catalog's `weight_only_precision` and `qformat` columns.
WEIGHT_ONLY = {p: row.weight_only_precision for p, row in PRECISIONS.items() if row.weight_only_precision}
QUANTIZE_QFORMATS = {p: row.qformat for p, row in PRECISIONS.items() if row.qformat}
# convert_checkpoint.py takes HF dataset ids (default ccdv/cnn_dailymail); ModelOpt's short name differs.
CALIB_DATASETS = {"cnn_dailymail": "ccdv/cnn_dailymail"}


def model_family(config: HfModelConfig) -> str:
    """The example folder for a checkpoint, from config.json; InputError for a family without a script here."""
    archs = list(config.get("architectures") or [])
    for key in [*archs, config.get("model_type")]:
        if key in FAMILIES:
            return FAMILIES[key]
    supported = sorted(k for k in FAMILIES if k[0].isupper())
    raise InputError(
        f"lane trtllm-engine converts Llama-family checkpoints (architectures {supported}); "
        f"this one is architectures={archs}, model_type={config.get('model_type')!r}: use lane trtllm, which loads "
        "Hugging Face checkpoints directly"
    )


def convert_script(examples_dir: Path | str, family: str) -> Path:
    # 1.x layout; releases before the models/core move used examples/<family>/ (facts §3).
    return Path(examples_dir) / "models" / "core" / family / "convert_checkpoint.py"


def quantize_script(examples_dir: Path | str) -> Path:
    return Path(examples_dir) / "quantization" / "quantize.py"


def uses_quantize(variant: Variant) -> bool:
    """fp8 / nvfp4 / int4_awq weights or an FP8 KV cache: ModelOpt PTQ through quantize.py (facts §0)."""
    return variant.precision in QUANTIZE_QFORMATS or variant.kv_cache_dtype is KVCacheDtype.FP8


def quantize_argv(spec: BuildSpec, variant: Variant, python: str, script: Path | str, source_dir: Path | str,
                  out_dir: Path | str, dtype: str) -> list[str]:
    """examples/quantization/quantize.py → a TensorRT-LLM checkpoint with the variant's mapping, for trtllm-build."""
    qformat = QUANTIZE_QFORMATS.get(variant.precision, "full_prec")
    c = variant.calibration
    argv = [python, str(script),
            arg(QUANTIZE, "model_dir"), str(source_dir),
            arg(QUANTIZE, "output_dir"), str(out_dir),
            arg(QUANTIZE, "dtype"), dtype,
            arg(QUANTIZE, "qformat"), qformat,
            arg(QUANTIZE, "tp_size"), str(variant.tp),
            arg(QUANTIZE, "pp_size"), str(variant.pp)]
    if variant.kv_cache_dtype in (KVCacheDtype.FP8, KVCacheDtype.INT8):
        argv += [arg(QUANTIZE, "kv_cache_dtype"), variant.kv_cache_dtype.value]
    samples = c.samples if c else 512
    seq = c.max_seq_length if c else 512
    argv += [arg(QUANTIZE, "calib_dataset"), c.dataset if c else "cnn_dailymail",
             arg(QUANTIZE, "calib_size"), str(samples), arg(QUANTIZE, "calib_max_seq_length"), str(seq)]
    return argv


def paged_context_fmha(spec: BuildSpec, variant: Variant) -> bool:
    """What the engine really gets: builder.py turns use_paged_context_fmha off with an INT8 KV cache ("doesn't
    work with int8 kv cache", facts §0), and with it chunked context and KV reuse."""
    opts = engine_options(spec.lane_options)
    return bool(opts.use_paged_context_fmha) and variant.kv_cache_dtype is not KVCacheDtype.INT8


def convert_argv(spec: BuildSpec, variant: Variant, python: str, script: Path | str, source_dir: Path | str,
                 out_dir: Path | str, dtype: str) -> list[str]:
    opts = engine_options(spec.lane_options)
    argv = [python, str(script),
            arg(CONVERT, "model_dir"), str(source_dir),
            arg(CONVERT, "output_dir"), str(out_dir),
            arg(CONVERT, "dtype"), dtype,
            arg(CONVERT, "tp_size"), str(variant.tp),
            arg(CONVERT, "pp_size"), str(variant.pp),
            arg(CONVERT, "workers"), str(min(opts.convert_workers, variant.tp * variant.pp))]
    p = variant.precision
    if uses_quantize(variant):  # a programming error: those go through quantize.py
        raise AssertionError(f"{variant.name} is quantized by quantize.py, not convert_checkpoint.py")
    if p in WEIGHT_ONLY:
        argv += [arg(CONVERT, "use_weight_only"), arg(CONVERT, "weight_only_precision"), WEIGHT_ONLY[p]]
    # --calib_* are read only with --int8_kv_cache (or --smoothquant) (facts §0).
    if variant.kv_cache_dtype is KVCacheDtype.INT8:
        argv.append(arg(CONVERT, "int8_kv_cache"))
    if variant.kv_cache_dtype is KVCacheDtype.INT8 and variant.calibration is not None:
        c = variant.calibration
        argv += [arg(CONVERT, "calib_dataset"), CALIB_DATASETS.get(c.dataset, c.dataset),
                 arg(CONVERT, "calib_size"), str(c.samples),
                 arg(CONVERT, "calib_max_seq_length"), str(c.max_seq_length)]
    if opts.load_by_shard:
        argv.append(arg(CONVERT, "load_by_shard"))
    return argv


def build_workers(unit: Unit, option: int | None) -> int:
    """--workers: one per rank, capped to the target's GPUs (trtllm-build caps it again to the visible GPUs)
    and to the lane option (each worker holds one rank's weights in host RAM, facts §12)."""
    world = unit.variant.tp * unit.variant.pp
    n = min(world, max(unit.target.gpu_count, 1))
    return max(1, min(n, option) if option else n)


def _enable(value: bool) -> str:
    return "enable" if value else "disable"


def build_argv(spec: BuildSpec, unit: Unit, checkpoint_dir: Path | str, engine_dir: Path | str,
               timing_cache: Path | str, input_timing_cache: Path | str | None = None) -> list[str]:
    """trtllm-build for one unit. Never --tp_size/--pp_size (removed in 0.12: parallelism is the checkpoint's).

    `timing_cache` should be absolute: the default `model.cache` is relative and lands in the CWD (facts §12).
    """
    opts = engine_options(spec.lane_options)
    p = unit.profile
    argv = ["trtllm-build",
            arg(TRTLLM_BUILD, "checkpoint_dir"), str(checkpoint_dir),
            arg(TRTLLM_BUILD, "output_dir"), str(engine_dir),
            arg(TRTLLM_BUILD, "gemm_plugin"), opts.gemm_plugin,
            arg(TRTLLM_BUILD, "gpt_attention_plugin"), opts.gpt_attention_plugin,
            # paged_kv_cache: false is refused by validate_options (in-flight batching needs it).
            arg(TRTLLM_BUILD, "kv_cache_type"), "paged" if p.paged_kv_cache else "continuous",
            arg(TRTLLM_BUILD, "remove_input_padding"), _enable(p.remove_input_padding),
            arg(TRTLLM_BUILD, "use_paged_context_fmha"), _enable(paged_context_fmha(spec, unit.variant)),
            arg(TRTLLM_BUILD, "max_batch_size"), str(p.max_batch_size),
            arg(TRTLLM_BUILD, "max_input_len"), str(p.max_input_len),
            arg(TRTLLM_BUILD, "max_seq_len"), str(p.max_seq_len),
            arg(TRTLLM_BUILD, "max_num_tokens"), str(p.max_num_tokens),
            arg(TRTLLM_BUILD, "max_beam_width"), str(opts.max_beam_width),
            arg(TRTLLM_BUILD, "workers"), str(build_workers(unit, opts.build_workers)),
            arg(TRTLLM_BUILD, "output_timing_cache"), str(timing_cache)]
    if input_timing_cache:
        argv += [arg(TRTLLM_BUILD, "input_timing_cache"), str(input_timing_cache)]
    if opts.use_fused_mlp is not None:
        argv += [arg(TRTLLM_BUILD, "use_fused_mlp"), _enable(opts.use_fused_mlp)]
    if opts.multiple_profiles is not None:
        argv += [arg(TRTLLM_BUILD, "multiple_profiles"), _enable(opts.multiple_profiles)]
    if opts.tokens_per_block is not None:
        argv += [arg(TRTLLM_BUILD, "tokens_per_block"), str(opts.tokens_per_block)]
    return argv


class EngineServeSettings(BaseModel):
    """What trtllm-serve of a prebuilt engine takes from the build: bundle.json `params` (written by build, read
    back by serve_command), or the profile's values (describe)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tp: int
    pp: int
    max_batch_size: int
    max_num_tokens: int
    kv_cache_free_gpu_memory_fraction: int | float  # as recorded: 1 stays "1" on the command line
    serve_backend: str | None = None

    @classmethod
    def of(cls, params: EngineServeSettings | Mapping[str, object],  # bundle.json params
           where: Path | str = BUNDLE_INFO) -> EngineServeSettings:
        if isinstance(params, EngineServeSettings):
            return params
        try:
            return cls.model_validate(dict(params))
        except ValidationError as err:
            field, msg = first_problem(err)
            raise InputError(f"{where}: params.{field}: {msg}: rebuild "
                             "the bundle") from None


def engine_serve_argv(engine_dir: Path | str, tokenizer_dir: Path | str,
                      unit_params: EngineServeSettings | Mapping[str, object],  # bundle.json params
                      host: str, port: int, backend: str = "tensorrt") -> list[str]:
    """trtllm-serve of a prebuilt engine: --backend trt|tensorrt (the default is pytorch since 1.0) + --tokenizer.
    `backend`: serve_backend_value() of the installed release."""
    s = EngineServeSettings.of(unit_params)
    return ["trtllm-serve", str(engine_dir),
            arg(SERVE, "backend"), backend,
            arg(SERVE, "tokenizer"), str(tokenizer_dir),
            arg(SERVE, "tp_size"), str(s.tp),
            arg(SERVE, "pp_size"), str(s.pp),
            arg(SERVE, "max_batch_size"), str(s.max_batch_size),
            arg(SERVE, "max_num_tokens"), str(s.max_num_tokens),
            arg(SERVE, "kv_cache_free_gpu_memory_fraction"), str(s.kv_cache_free_gpu_memory_fraction),
            arg(SERVE, "host"), host, arg(SERVE, "port"), str(port)]


def plugin_checks(opts: EngineOptions, unit: Unit, shape: ModelShape | None) -> list[Check]:
    """trtllm-build plugin dtypes must be the model's dtype (or the variant's fp8/nvfp4)."""
    model_dtype = activation_dtype(unit.variant.precision, shape, opts.dtype)
    out = []
    for name, value in (("gemm_plugin", opts.gemm_plugin), ("gpt_attention_plugin", opts.gpt_attention_plugin)):
        if value in ("auto", "disable", "int32"):
            continue
        if value in ("fp8", "nvfp4"):
            ok = unit.variant.precision.value == value
            out.append(Check(name="plugin_dtype", ok=ok,
                             message=f"{name}={value} " + ("matches" if ok else "needs a variant of precision "
                                                            f"{value}; this one is {unit.variant.precision.value}"),
                             fix=None if ok else f"{name}: auto"))
        elif model_dtype is None:
            out.append(Check(name="plugin_dtype", ok=True,
                             message=f"{name}={value}; the model dtype is unknown until config.json is read"))
        else:
            ok = value == model_dtype
            out.append(Check(name="plugin_dtype", ok=ok,
                             message=f"{name}={value} " + ("matches the model dtype" if ok else
                                                            f"differs from the model dtype {model_dtype}"),
                             fix=None if ok else f"{name}: {model_dtype} (or auto)"))
    return out


def check_engine_dir(engine_dir: Path, world: int) -> TrtllmConfig:
    """config.json + rank{N}.engine for every rank; the engine's config.json as a dict."""
    missing = [f"rank{r}.engine" for r in range(world) if not (engine_dir / f"rank{r}.engine").is_file()]
    if not (engine_dir / "config.json").is_file():
        missing.insert(0, "config.json")
    if missing:
        raise ToolError(f"trtllm-build finished but {engine_dir} lacks {missing}")
    return json_object((engine_dir / "config.json").read_text(), str(engine_dir / "config.json"))


def check_checkpoint_dir(ckpt: Path, variant: Variant) -> TrtllmConfig:
    """The converted checkpoint: config.json whose mapping is the variant's, and rank{N}.safetensors."""
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        raise ToolError(f"{ckpt} has no config.json: not a TensorRT-LLM checkpoint (convert it first)")
    cfg = json_object(cfg_path.read_text(), str(cfg_path))
    mapping = cfg.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    if (tp, pp) != (variant.tp, variant.pp):
        raise ToolError(f"{ckpt} was converted for tp {tp} × pp {pp}, the variant wants tp {variant.tp} × pp "
                        f"{variant.pp}: parallelism is fixed at conversion; convert again")
    world = tp * pp
    missing = [f"rank{r}.safetensors" for r in range(world) if not (ckpt / f"rank{r}.safetensors").is_file()]
    if missing:
        raise ToolError(f"{ckpt} lacks {missing}")
    return cfg


def copy_tokenizer(source_dir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(TOKENIZER_FILES) + list(TOKENIZER_EXTRA):
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, dest / name)


class TrtllmEngineLane(TrtllmLaneBase):
    name = "trtllm-engine"
    install_hint = ENGINE_INSTALL_HINT
    convert_tools = (CONVERT, QUANTIZE)
    # convert_checkpoint's --use_parallel_embedding is off by default: every tp rank holds the whole embedding.
    embedding_sharded = False

    def options(self, spec: BuildSpec) -> EngineOptions:
        return engine_options(spec.lane_options)

    def dtype_option(self, spec: BuildSpec) -> str | None:
        return self.options(spec).dtype  # convert_checkpoint.py --dtype (model_activation_dtype)

    def preflight_checks(self, spec: BuildSpec, unit: Unit, shape: ModelShape | None) -> list[Check]:
        opts = self.options(spec)
        why = None
        if unit.variant.kv_cache_dtype is KVCacheDtype.INT8:
            why = "an INT8 KV cache, with which builder.py turns the paged context FMHA off"
        elif not opts.use_paged_context_fmha:
            why = "lane option use_paged_context_fmha: false"
        return (precision_checks(unit, self.fp8_kv_on_ampere, self.precision_routes)
                + plugin_checks(opts, unit, shape) + chunked_prefill_check(unit, why)
                + self.registry_checks(spec, unit))

    def build_footprint(self, spec: BuildSpec, unit: Unit, est: WeightsEstimate, source_bytes: int,
                        per_rank_bytes: int) -> tuple[float, float]:
        # convert_checkpoint loads the whole HF model unless --load_by_shard; each trtllm-build worker holds one
        # rank's weights and the serialized engine (facts §12: #538, #1543, #2690).
        opts = self.options(spec)
        world = unit.variant.tp * unit.variant.pp
        convert = (2 * per_rank_bytes) if opts.load_by_shard else source_bytes + per_rank_bytes
        workers = min(world, unit.target.gpu_count or 1, int(opts.build_workers or world))
        host = max(convert, 2 * per_rank_bytes * workers)
        return host, source_bytes + 2 * est.weights_bytes_total  # HF checkpoint + converted checkpoint + engines

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        problems = super().validate_options(spec)
        if not spec.toolchain.trtllm_version:
            problems.append(("toolchain.trtllm_version",
                             "lane trtllm-engine needs a pinned TensorRT-LLM 1.0 – 1.2.x (e.g. 1.2.1): an unpinned "
                             "or --pre install may be 1.3+, which has no engine path"))
        problems += unsupported_problems(spec, self.name, "does not emit MoE parallelism (convert_checkpoint.py's "
                                                          "MoE flags are not registered here)")
        load_by_shard = bool(self.options(spec).load_by_shard)
        for i, v in enumerate(spec.variants):
            if v.kv_cache_dtype in (KVCacheDtype.FP16, KVCacheDtype.BF16):
                same = SAME_KV_DTYPE.get(TORCH_DTYPE.get(v.precision, ""))
                if same is not v.kv_cache_dtype:
                    problems.append((f"variants.{i}.kv_cache_dtype",
                                     f"convert_checkpoint.py has no {v.kv_cache_dtype.value} KV option: the KV "
                                     "cache is the model's dtype unless fp8/int8; use auto, fp8 or int8"))
            if load_by_shard and v.kv_cache_dtype is KVCacheDtype.INT8:
                # The variant's field: only its units are refused (the other variants convert with load_by_shard).
                problems.append((f"variants.{i}.kv_cache_dtype",
                                 "int8 with lane_options.load_by_shard: convert_checkpoint.py asserts \"load by "
                                 "shard not supported\" with --int8_kv_cache (llama convert_checkpoint.py): drop "
                                 "lane option load_by_shard, or use kv_cache_dtype fp8 (sm89+) or auto"))
        return problems

    def _examples_dir(self, spec: BuildSpec | None) -> str | None:
        opts = engine_options(spec.lane_options if spec else None)
        return opts.examples_dir or EnvSettings.read().trtllm_examples_dir

    def tool_commands(self, spec: BuildSpec | None) -> dict[str, list[str]]:
        tools = {TRTLLM_BUILD: ["trtllm-build"], SERVE: ["trtllm-serve"]}
        examples = self._examples_dir(spec)
        if examples:
            tools[CONVERT] = [self.python, str(convert_script(examples, "llama"))]
            tools[QUANTIZE] = [self.python, str(quantize_script(examples))]
        triton_dir = self.triton_dir(spec)
        if triton_dir is not None:
            tools[FILL] = [self.python, str(triton_dir / triton.FILL_TEMPLATE)]
        return tools

    def triton_dir(self, spec: BuildSpec | None) -> Path | None:
        return Path(engine_options(spec.lane_options if spec else None).triton_dir)

    # convert ------------------------------------------------------------------------------------------------

    def convert(self, spec: BuildSpec, variant: Variant, source_dir: Path, workdir: Path) -> ConvertResult:
        self.versions()
        config = read_model_config(source_dir)
        family = model_family(config)
        examples = self._examples_dir(spec)
        quantize = uses_quantize(variant)
        script = None
        if examples:
            script = quantize_script(examples) if quantize else convert_script(examples, family)
        if script is None or not script.is_file():
            what = "examples/quantization/quantize.py" if quantize else f"convert_checkpoint.py for {family}"
            raise ToolError(
                f"{what} not found{' at ' + str(script) if script else ''}: set lane "
                "option examples_dir (or $EF_TRTLLM_EXAMPLES_DIR) to the examples/ folder of the installed "
                "TensorRT-LLM release (git checkout v<version> of NVIDIA/TensorRT-LLM)"
            )
        dtype = model_activation_dtype(variant, source_dir, self.options(spec).dtype) or "auto"
        out = workdir / "checkpoint"
        if out.exists():
            shutil.rmtree(out)
        if quantize:
            argv = quantize_argv(spec, variant, self.python, script, source_dir, out, dtype)
            cmd = Command(argv=argv, cwd=str(workdir), tool=QUANTIZE, description="quantize.py (ModelOpt PTQ)")
        else:
            argv = convert_argv(spec, variant, self.python, script, source_dir, out, dtype)
            cmd = Command(argv=argv, cwd=str(workdir), tool=CONVERT, description=f"convert_checkpoint.py ({family})")
        check_against_surface([cmd], self.pinned_surface(spec))  # before the conversion's GPU time
        run_tool(argv, workdir / "logs" / "convert.log", timeout_s=CONVERT_TIMEOUT_S, cwd=workdir,
                 what=cmd.description)
        ckpt_cfg = check_checkpoint_dir(out, variant)
        # The tokenizer travels with the converted checkpoint: build needs it for Triton and trtllm-serve.
        copy_tokenizer(source_dir, out / TOKENIZER_DIR)
        params = {"format": "trtllm-checkpoint", "family": family, "dtype": dtype,
                  "precision": variant.precision.value, "kv_cache_dtype": variant.kv_cache_dtype.value,
                  "tp": variant.tp, "pp": variant.pp, "quantization": ckpt_cfg.get("quantization"),
                  "route": "quantize.py" if quantize else "convert_checkpoint.py"}
        if (quantize or variant.kv_cache_dtype is KVCacheDtype.INT8) and variant.calibration:
            params["calibration"] = variant.calibration.model_dump()
        return ConvertResult(checkpoint_dir=str(out), params=params, commands=[cmd])

    # build --------------------------------------------------------------------------------------------------

    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path,
              draft_dir: Path | None = None, adapter_dirs: dict[str, Path] | None = None) -> BuildResult:
        versions = self.versions()
        surface = self.refuse_unsupported(spec, unit)
        opts = self.options(spec)
        logs = workdir / "logs"
        ckpt_cfg = check_checkpoint_dir(checkpoint_dir, unit.variant)
        gpus, gpu_env = self.select_gpus(unit, logs)
        bundle = fresh_dir(workdir / "bundle")
        engine_dir = bundle / ENGINE_DIR
        scratch = fresh_dir(workdir / "build-scratch")  # trtllm-build writes into its CWD
        timing_cache = (workdir / "timing.cache").resolve()
        previous = timing_cache if timing_cache.is_file() else None
        argv = build_argv(spec, unit, checkpoint_dir.resolve(), engine_dir, timing_cache, previous)
        cmd = Command(argv=argv, env=gpu_env, cwd=str(scratch), tool=TRTLLM_BUILD, description="trtllm-build")
        run = run_tool(argv, logs / "trtllm-build.log", timeout_s=BUILD_TIMEOUT_S, env=gpu_env, cwd=scratch,
                       what="trtllm-build")
        world = unit.variant.tp * unit.variant.pp
        engine_cfg = check_engine_dir(engine_dir, world)
        tokenizer_src = checkpoint_dir / TOKENIZER_DIR
        if not tokenizer_src.is_dir():
            raise ToolError(f"{checkpoint_dir} has no {TOKENIZER_DIR}/ (converted by another tool?): the engine "
                            "bundle needs the Hugging Face tokenizer")
        shutil.copytree(tokenizer_src, bundle / TOKENIZER_DIR)

        mount = opts.triton_bundle_mount or str(bundle.resolve())
        model_dtype = str(ckpt_cfg.get("dtype") or "float16")
        params_t = triton.TritonParams.for_unit(unit, opts, engine_dir=f"{mount}/{ENGINE_DIR}",
                                                tokenizer_dir=f"{mount}/{TOKENIZER_DIR}", model_dtype=model_dtype,
                                                chunked_context=paged_context_fmha(spec, unit.variant))
        triton_cmds = triton.build_repository(Path(opts.triton_dir), bundle / TRITON_REPO, params_t,
                                              python=self.python, log_dir=logs)
        p = unit.profile
        params = {"tp": unit.variant.tp, "pp": unit.variant.pp, "precision": unit.variant.precision.value,
                  "max_batch_size": p.max_batch_size, "max_input_len": p.max_input_len,
                  "max_seq_len": p.max_seq_len, "max_num_tokens": p.max_num_tokens,
                  "kv_cache_free_gpu_memory_fraction": p.kv_cache_free_gpu_memory_fraction,
                  "gemm_plugin": opts.gemm_plugin, "gpt_attention_plugin": opts.gpt_attention_plugin,
                  "serve_backend": serve_backend_value(surface.tensorrt_llm,
                                                       (surface.tools.get(SERVE) or _NO_HELP).choices.get("backend")),
                  "build_argv": argv}
        launch = triton.launch_command(Path(opts.triton_dir), f"{mount}/{TRITON_REPO}", world)
        self.write_bundle_info(bundle, unit, params, gpus, versions, BundleInfo(
            engine_dir=ENGINE_DIR, tokenizer_dir=TOKENIZER_DIR, triton_model_repo=TRITON_REPO,
            engine_version=engine_cfg.get("version"),
            triton=TritonSettings(bundle_mount=mount, launch=launch.argv),
            serve=ServeSettings(health="/health"),
        ))
        size = sum(f.stat().st_size for f in engine_dir.glob("rank*.engine"))
        metrics = {"build_s": round(run.wall_s, 3), "engine_bytes": float(size),
                   "peak_host_rss_mb": round(run.peak_rss_mb, 1)}
        device = {"gpus": [g.facts() for g in gpus]}
        return BuildResult(bundle_dir=str(bundle), params=params, device=device, commands=[cmd, *triton_cmds],
                           metrics=metrics)

    # serve --------------------------------------------------------------------------------------------------

    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        info = read_bundle_info(bundle_dir)
        root = Path(bundle_dir).resolve()
        if not info.engine_dir or not info.tokenizer_dir:
            raise InputError(f"{root / BUNDLE_INFO} names no engine_dir/tokenizer_dir: not a bundle of lane "
                             f"{self.name}; serve it with the lane that built it, or rebuild it")
        engine, tok = root / info.engine_dir, root / info.tokenizer_dir
        settings = EngineServeSettings.of(info.params, root / BUNDLE_INFO)
        backend = settings.serve_backend or serve_backend_value(info.versions.get("tensorrt_llm"))
        argv = engine_serve_argv(engine, tok, settings, host, port, backend)
        return ServeCommand(command=Command(argv=argv, description=f"trtllm-serve --backend {backend}"),
                            model_name=str(engine), health_path="/health", tokenizer_dir=str(tok))

    def describe(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None = None) -> list[Command]:
        opts = self.options(spec)
        version = surface.tensorrt_llm if surface else spec.toolchain.trtllm_version
        why = lane_release_problem(self.name, version) if version else None
        if why:  # 1.3+ has no trtllm-build to describe: `plan` refuses with the reason, not a command list
            raise InputError(f"toolchain.trtllm_version: {why}")
        examples = self._examples_dir(spec) or "$EF_TRTLLM_EXAMPLES_DIR"
        dtype = model_activation_dtype(unit.variant, None, opts.dtype) or "auto"
        if uses_quantize(unit.variant):
            first = Command(argv=quantize_argv(spec, unit.variant, WORKER_PYTHON, quantize_script(examples),
                                               "<source checkpoint>", "<work>/checkpoint", dtype),
                            tool=QUANTIZE, description="convert: quantize.py (ModelOpt PTQ)")
        else:
            first = Command(argv=convert_argv(spec, unit.variant, WORKER_PYTHON, convert_script(examples, "llama"),
                                              "<source checkpoint>", "<work>/checkpoint", dtype),
                            tool=CONVERT, description="convert (dtype auto = the checkpoint's)")
        build = build_argv(spec, unit, "<work>/checkpoint", "<bundle>/engine", "<work>/timing.cache")
        p = unit.profile
        serve_params = EngineServeSettings(tp=unit.variant.tp, pp=unit.variant.pp, max_batch_size=p.max_batch_size,
                                           max_num_tokens=p.max_num_tokens,
                                           kv_cache_free_gpu_memory_fraction=p.kv_cache_free_gpu_memory_fraction)
        triton_params = triton.TritonParams.for_unit(unit, opts, engine_dir="<bundle>/engine",
                                                     tokenizer_dir="<bundle>/tokenizer",
                                                     model_dtype=dtype if dtype != "auto" else "float16",
                                                     chunked_context=paged_context_fmha(spec, unit.variant)
                                                     ).for_templates(surface.triton_templates if surface else None,
                                                                     version)
        choices = (surface.tools.get(SERVE) or _NO_HELP).choices.get("backend") if surface else None
        backend = serve_backend_value(version, choices)
        return [
            first,
            Command(argv=build, tool=TRTLLM_BUILD, description="build"),
            *triton.fill_commands(Path(opts.triton_dir), Path("<bundle>") / TRITON_REPO, triton_params,
                                  python=WORKER_PYTHON),
            Command(argv=engine_serve_argv("<bundle>/engine", "<bundle>/tokenizer", serve_params, "127.0.0.1", 8000,
                                           backend),
                    tool=SERVE, description="serve"),
        ]


_NO_HELP = ToolHelp()
