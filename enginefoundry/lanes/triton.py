"""The Triton `inflight_batcher_llm` model repository of an engine bundle (TensorRT-LLM 1.0 – 1.2.x).

The templates (`all_models/inflight_batcher_llm/<model>/config.pbtxt`) are filled by the release's own
`tools/fill_template.py`, never by a re-implementation, so a key a release lacks fails loudly. Its behaviour
(facts §10, and its source): `string.Template.safe_substitute`, so an unfilled `${x}` stays literal and fails
later in Triton (`unable to find backend library for backend '${triton_backend}'`, #1803); every given key must
exist in the file ("key '…' does not exist in the file …"); `max_queue_size` and `max_queue_delay_microseconds`
are pre-filled with 0; a backslash escapes `,` and `:`, once per split (see `escape_value`). The C++ backend and these
templates are removed in 1.3 (#15907).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry.errors import ToolError
from enginefoundry.inputs.toolchain import parse_version, template_keys
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes.base import Command
from enginefoundry.lanes.trtllm_flags import (
    FILL,
    LAUNCH_TRITON,
    PROMPT_TABLE_KEY,
    PROMPT_TABLE_SINCE,
    TRITON_TEMPLATE_KEYS,
    arg,
)
from enginefoundry.lanes.trtllm_options import EngineOptions, engine_options
from enginefoundry.runner import run_tool

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")
TEMPLATES = Path("all_models") / "inflight_batcher_llm"
FILL_TEMPLATE = Path("tools") / "fill_template.py"
LAUNCH = Path("scripts") / "launch_triton_server.py"
DATA_TYPES = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}
# Placeholders inside `string_value: "${x}"` are optional parameters: the backend treats an unfilled one as unset.
_OPTIONAL = re.compile(r'string_value:\s*"\$\{(\w+)\}"')
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


class TritonParams(BaseModel):
    engine_dir: str
    tokenizer_dir: str
    triton_max_batch_size: int = Field(ge=1)
    kv_cache_free_gpu_mem_fraction: float = Field(gt=0, le=1)
    decoupled_mode: bool = False
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    max_beam_width: int = Field(default=1, ge=1)
    instance_count: int = Field(default=1, ge=1)
    model_dtype: str = "float16"
    enable_chunked_context: bool = True
    batch_scheduler_policy: str | None = None
    enable_kv_cache_reuse: bool | None = None
    # Which templates have ${prompt_embedding_table_data_type}: read from the templates when they are at hand
    # (template_keys), else from the installed or pinned release (1.1+), else assumed present (1.1+ is newer).
    prompt_table_templates: frozenset[str] = frozenset({"tensorrt_llm", "tensorrt_llm_bls"})

    def for_templates(self, keys: dict[str, list[str]] | None = None, release: str | None = None) -> TritonParams:
        """These parameters for the templates at hand (their `${key}` sets) or, without them, for a release."""
        if keys is not None:
            have = frozenset(m for m, k in keys.items() if PROMPT_TABLE_KEY in k)
        elif release and parse_version(release).release < parse_version(PROMPT_TABLE_SINCE).release:
            have = frozenset()
        else:
            return self
        return self.model_copy(update={"prompt_table_templates": have})

    @classmethod
    def for_unit(cls, unit: Unit, opts: EngineOptions | Mapping[str, object], *, engine_dir: str, tokenizer_dir: str,
                 model_dtype: str, chunked_context: bool | None = None) -> TritonParams:
        opts = engine_options(opts)  # a raw mapping: every option by name (resolve_options)
        p = unit.profile
        return cls(
            engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, triton_max_batch_size=p.max_batch_size,
            kv_cache_free_gpu_mem_fraction=p.kv_cache_free_gpu_memory_fraction,
            decoupled_mode=opts.triton_decoupled_mode,
            max_queue_delay_microseconds=opts.triton_max_queue_delay_microseconds,
            max_beam_width=opts.max_beam_width, instance_count=opts.triton_instance_count,
            model_dtype=model_dtype if model_dtype in DATA_TYPES else "float16",
            # Chunked context needs the paged context FMHA in the engine (lane option, default on; off with an
            # INT8 KV cache, which builder.py turns it off for).
            enable_chunked_context=bool(opts.use_paged_context_fmha if chunked_context is None
                                        else chunked_context),
            batch_scheduler_policy=opts.triton_batch_scheduler_policy,
            enable_kv_cache_reuse=opts.triton_enable_kv_cache_reuse,
        )


def _b(value: bool) -> str:
    return "true" if value else "false"


def substitutions(params: TritonParams) -> dict[str, dict[str, str]]:
    """fill_template.py keys per model. Every key is one the facts document for that template."""
    bs = str(params.triton_max_batch_size)
    dtype = DATA_TYPES[params.model_dtype]
    trt = {
        "triton_backend": "tensorrtllm",  # the C++ backend; "python" is the other choice
        "triton_max_batch_size": bs,
        "decoupled_mode": _b(params.decoupled_mode),
        "max_beam_width": str(params.max_beam_width),
        "engine_dir": params.engine_dir,  # → parameter gpt_model_path
        "max_queue_delay_microseconds": str(params.max_queue_delay_microseconds),
        # → gpt_model_type; V1 was removed in 0.20, so this is the only value.
        "batching_strategy": "inflight_fused_batching",
        "kv_cache_free_gpu_mem_fraction": str(params.kv_cache_free_gpu_mem_fraction),
        # Input declarations use these as data_type: an unfilled one makes config.pbtxt unparsable.
        "encoder_input_features_data_type": dtype,
        "logits_datatype": "TYPE_FP32",
        "exclude_input_in_output": "true",
        "enable_chunked_context": _b(params.enable_chunked_context),
    }
    if params.batch_scheduler_policy:
        trt["batch_scheduler_policy"] = params.batch_scheduler_policy
    if params.enable_kv_cache_reuse is not None:
        trt["enable_kv_cache_reuse"] = _b(params.enable_kv_cache_reuse)
    n = str(params.instance_count)
    subs = {
        "preprocessing": {"tokenizer_dir": params.tokenizer_dir, "triton_max_batch_size": bs,
                          "preprocessing_instance_count": n,
                          "max_queue_delay_microseconds": str(params.max_queue_delay_microseconds)},
        "tensorrt_llm": trt,
        "postprocessing": {"tokenizer_dir": params.tokenizer_dir, "triton_max_batch_size": bs,
                           "postprocessing_instance_count": n},
        "ensemble": {"triton_max_batch_size": bs, "logits_datatype": "TYPE_FP32"},
        "tensorrt_llm_bls": {"triton_max_batch_size": bs, "decoupled_mode": _b(params.decoupled_mode),
                             "bls_instance_count": n, "logits_datatype": "TYPE_FP32"},
    }
    for model in params.prompt_table_templates:  # a data_type: unfilled, Triton rejects the config
        subs[model][PROMPT_TABLE_KEY] = dtype
    for model, keys in subs.items():
        unknown = set(keys) - TRITON_TEMPLATE_KEYS[model]
        if unknown:  # a programming error: fill_template.py would assert on it
            raise AssertionError(f"{model}: {sorted(unknown)} are not documented template keys")
    return subs


def escape_value(value: str) -> str:
    """Escape a value for fill_template.py, which splits twice, each time turning `\\x` into `x`: first the
    argument on `,` into pairs, then each pair on `:` into key and value. So `:` and `\\` are escaped for the
    second split, and the result (with `,`) again for the first."""
    inner = value.replace("\\", "\\\\").replace(":", "\\:")
    return inner.replace("\\", "\\\\").replace(",", "\\,")


def substitution_arg(keys: dict[str, str]) -> str:
    return ",".join(f"{k}:{escape_value(v)}" for k, v in keys.items())


def fill_commands(triton_dir: Path, repo_dir: Path, params: TritonParams, python: str | None = None) -> list[Command]:
    fill = triton_dir / FILL_TEMPLATE
    return [
        Command(argv=[python or sys.executable, str(fill), arg(FILL, "in_place"),
                      str(repo_dir / model / "config.pbtxt"), substitution_arg(keys)],
                tool=FILL, template_keys={model: sorted(keys)}, description=f"fill Triton template {model}")
        for model, keys in substitutions(params).items()
    ]


def unfilled(text: str) -> tuple[list[str], list[str]]:
    """(required placeholders left, optional ones left) in a config.pbtxt."""
    optional = set(_OPTIONAL.findall(text))
    required = [k for k in _PLACEHOLDER.findall(_OPTIONAL.sub("", text))]
    return sorted(set(required)), sorted(optional)


def check_repository(repo_dir: Path, params: TritonParams | None = None) -> list[str]:
    """Problems in a filled repository: missing models, placeholders Triton would choke on."""
    problems = []
    wanted = substitutions(params) if params else {}
    for model in MODELS:
        path = repo_dir / model / "config.pbtxt"
        if not path.is_file():
            problems.append(f"{model}/config.pbtxt is missing")
            continue
        text = path.read_text()
        required, optional = unfilled(text)
        for key in required:
            problems.append(f"{model}/config.pbtxt: ${{{key}}} is unfilled (Triton rejects it, #1803)")
        for key in wanted.get(model, {}):
            if key in optional:
                problems.append(f"{model}/config.pbtxt: ${{{key}}} was to be filled and is not")
    return problems


def build_repository(triton_dir: Path, repo_dir: Path, params: TritonParams, *, python: str | None = None,
                     log_dir: Path) -> list[Command]:
    """Copy the five templates, fill them with the release's fill_template.py, and check the result."""
    templates, fill = triton_dir / TEMPLATES, triton_dir / FILL_TEMPLATE
    if not templates.is_dir() or not fill.is_file():
        raise ToolError(f"Triton templates or fill_template.py not found under {triton_dir} (expected {TEMPLATES} "
                        f"and {FILL_TEMPLATE}): set lane option triton_dir to /app in the NGC Triton TRT-LLM "
                        "container, or to the triton_backend/ folder of the matching TensorRT-LLM checkout")
    if repo_dir.exists():
        shutil.rmtree(repo_dir)
    repo_dir.mkdir(parents=True)
    for model in MODELS:
        if not (templates / model).is_dir():
            raise ToolError(f"template {templates / model} is missing from this Triton backend tree")
        shutil.copytree(templates / model, repo_dir / model)
    params = params.for_templates(template_keys(triton_dir))
    cmds = fill_commands(triton_dir, repo_dir, params, python)
    for cmd, model in zip(cmds, substitutions(params), strict=True):
        run_tool(cmd.argv, log_dir / f"fill_template-{model}.log", timeout_s=120, what=f"fill_template {model}")
    problems = check_repository(repo_dir, params)
    if problems:
        raise ToolError("the Triton model repository is not complete:\n  " + "\n  ".join(problems))
    return cmds


def launch_command(triton_dir: Path, model_repo: str, world_size: int) -> Command:
    """How a serving team starts Triton on the repository (recorded in bundle.json, not run here: it Popens
    mpirun and returns at once, and --world_size must equal the engine's tp × pp)."""
    return Command(argv=["python3", str(triton_dir / LAUNCH), arg(LAUNCH_TRITON, "world_size"), str(world_size),
                         arg(LAUNCH_TRITON, "model_repo"), model_repo],
                   description="launch Triton (poll its health endpoint yourself)")
