"""The Triton model repository of a `trtllm` (PyTorch backend) bundle: the LLM API model, configured by `model.yaml`.

Upstream (trtllm_flags REF_LLMAPI_*): `triton_backend/all_models/llmapi/tensorrt_llm/` holds `config.pbtxt`
(backend "python", no `${}` keys: nothing to fill), `1/model.py` and `1/model.yaml`. model.py reads model.yaml:
`triton_config.decoupled` and `triton_config.max_batch_size` (both required; `cancellation_check_period_ms` optional)
go to Triton, every other key goes to `LLM()` through `update_llm_args_with_extra_dict`, the same path as
`trtllm-serve --extra_llm_api_options`, so the runtime YAML of the bundle is the model.yaml's body. The template's
own comment: `max_batch_size: 0 # The current implementation does not support batching` (the LLM API batches in
flight itself). Since the engine backend's removal (#15907) this is the only Triton model TensorRT-LLM keeps, and
tensorrtllm_backend's README documents only it (#858, f526fc5). The repository is copied from the installed
backend tree (never re-implemented) and only `1/model.yaml` is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from enginefoundry.errors import ToolError
from enginefoundry.inputs.toolchain import LLMAPI_FILES, LLMAPI_TEMPLATE
from enginefoundry.lanes.base import Command
from enginefoundry.lanes.trtllm_flags import LAUNCH_TRITON, LLMAPI_TRITON, arg, flag
from enginefoundry.schemas.loose import TrtllmConfig

MODEL = "tensorrt_llm"  # the model's name in the repository (the template's config.pbtxt `name`)
REPO = "triton_model_repo"
TEMPLATE = Path("all_models") / LLMAPI_TEMPLATE
LAUNCH = Path("scripts") / "launch_triton_server.py"
# model.yaml keys the lane writes besides the LLM API options, checked against the installed template's keys.
TEMPLATE_KEYS = ("model", "backend", "triton_config", "triton_config.max_batch_size", "triton_config.decoupled")


def model_yaml(runtime_config: TrtllmConfig, model_path: str,
               decoupled: bool) -> TrtllmConfig:
    """The model.yaml: the bundle's LLM API options, the checkpoint and the two Triton settings model.py reads."""
    for key in TEMPLATE_KEYS:
        flag(LLMAPI_TRITON, key)  # registered with its evidence (KeyError otherwise)
    return {"model": model_path, "backend": "pytorch", **runtime_config,
            "triton_config": {"max_batch_size": 0, "decoupled": bool(decoupled)}}


def template_dir(triton_dir: Path | str) -> Path:
    return Path(triton_dir) / TEMPLATE


def missing_template(triton_dir: Path | str) -> str | None:
    """Why the backend tree has no LLM API model, or None when it has one."""
    root = template_dir(triton_dir)
    absent = [name for name in LLMAPI_FILES if not (root / name).is_file()]
    if not absent:
        return None
    return (f"the Triton backend tree {triton_dir} has no LLM API model ({root}: {', '.join(absent)} missing): set "
            "lane option triton_dir to the release's triton_backend tree (the TensorRT-LLM source's "
            "triton_backend/, or /app in a tritonserver trtllm-python image), or set triton: false")


def build_repository(triton_dir: Path | str, dest: Path,
                     yaml_body: TrtllmConfig) -> Path:
    """Copy the installed LLM API model into `dest/tensorrt_llm` and write its 1/model.yaml. Returns the repo."""
    why = missing_template(triton_dir)
    if why:
        raise ToolError(why)
    model_dir = dest / MODEL
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(template_dir(triton_dir), model_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (model_dir / "1" / "model.yaml").write_text(yaml.safe_dump(yaml_body, sort_keys=False))
    return dest


def launch_command(triton_dir: Path | str, model_repo: str, llm_api_keys: list[str],
                   python: str = "python3") -> Command:
    """How a serving team starts Triton on the repository (recorded in bundle.json, not run at build time). The
    LLM API spawns its own ranks for tp × pp, so the launcher gets --model_repo only (tensorrtllm_backend
    docs/llmapi.md)."""
    return Command(argv=[python, str(Path(triton_dir) / LAUNCH), arg(LAUNCH_TRITON, "model_repo"), model_repo],
                   tool=LAUNCH_TRITON, llm_api_keys=list(llm_api_keys),
                   template_keys={LLMAPI_TEMPLATE: list(TEMPLATE_KEYS)},
                   description="Triton: LLM API model repository (1/model.yaml), launched with")
