"""What lane trtllm makes of `model.adapters` (issue 36): TensorRT-LLM's `lora_config` for a release, the adapters in
the bundle, how a request selects one, and the refusals (field, why, the fix) decided before any download.

adapter_mode serve: one `trtllm-serve` serves the base and every adapter. The runtime YAML's `lora_config` names the
bundled adapters (`lora_dir`, relative to the server's working folder, which links `adapters` to
`<bundle>/adapters` wherever the unit is unpacked, as the speculative draft is), the largest rank (`max_lora_rank`:
the spec's `model.max_lora_rank`), how many adapters the GPU and host caches hold (`max_loras`, `max_cpu_loras`: all
of them) and their format (`lora_ckpt_source: hf`, PEFT folders). A request picks its adapter with the body's
`lora_request` {lora_name, lora_int_id, lora_path} and names the base as its `model` (the feature page's "TRTLLM
serve with LoRA" client; openai_protocol.py's `lora_request` field): `adapter_request`.

adapter_mode merge: the merged checkpoint is an ordinary Hugging Face checkpoint, which the lane converts (passes
through, or quantizes with hf_ptq.py) like any source: nothing LoRA-specific is emitted.

The bundle's `adapters/<name>` folders are both lanes' (the reference lane's scoring server serves them too):
`bundle_adapters` writes them, `bundled_adapters` reads them back from bundle.json.

Evidence: trtllm_flags REF_LORA_* (docs/trtllm-compat.md "LoRA adapters").
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel, JsonValue

from enginefoundry.confine import check_name
from enginefoundry.errors import InputError
from enginefoundry.inputs.adapters import read_adapter_config
from enginefoundry.lanes.trtllm_flags import CHECKED, LLM_API, LORA_SINCE, REF_LORA_CONFIG, flag
from enginefoundry.schemas.bundle_info import BUNDLE_INFO, BundleInfo
from enginefoundry.spec import BuildSpec
from enginefoundry.store.backends import clone_or_copy

BUNDLE_ADAPTERS_DIR = "adapters"  # model.adapters in adapter_mode serve: <bundle>/adapters/<name>
LORA_CKPT_SOURCE = "hf"  # PEFT folders (adapter_config.json + adapter_model.safetensors): LoraConfig's "hf" format
# TensorRT-LLM's default TensorRT-LLM → Hugging Face module names (REF_LORA_CONFIG,
# get_default_trtllm_modules_to_hf_modules): the HF names an adapter's target_modules may use on this lane.
DEFAULT_TRTLLM_TO_HF = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_dense": "o_proj",
    "mlp_h_to_4h": "gate_proj", "mlp_4h_to_h": "down_proj", "mlp_gate": "up_proj", "mlp_gate_up": "gate_up_proj",
    "moe_h_to_4h": "w1", "moe_4h_to_h": "w2", "moe_gate": "w3", "moe_router": "gate",
}
MAPPED_HF_MODULES = frozenset(DEFAULT_TRTLLM_TO_HF.values())
# PEFT's shorthand for every linear layer but the output head: on the architectures the map covers, those layers
# are the mapped projections (an architecture with others is refused when its adapter lists them by name).
ALL_LINEAR = "all-linear"


def adapter_path(name: str) -> str:
    """An adapter's folder as the YAML and each request name it: relative to the server's working folder."""
    return f"{BUNDLE_ADAPTERS_DIR}/{check_name(name, 'model.adapters.name')}"


class LoraConfigKeys(BaseModel):
    """The `lora_config` keys lane trtllm writes (each registered in trtllm_flags with its evidence)."""

    lora_dir: list[str]  # the bundled adapters, relative to the server's working folder
    max_lora_rank: int  # model.max_lora_rank
    max_loras: int  # adapters the GPU cache holds: all of them
    max_cpu_loras: int  # and the host cache
    lora_ckpt_source: str = LORA_CKPT_SOURCE


def lora_config(spec: BuildSpec) -> LoraConfigKeys | None:
    """`lora_config` of the LLM API YAML for a unit serving adapters; None for any other (the YAML, and so every
    existing unit key, is unchanged without adapters)."""
    if not spec.model.serves_adapters:
        return None
    names = [a.name for a in spec.model.adapters]
    return LoraConfigKeys(lora_dir=[adapter_path(n) for n in names], max_lora_rank=spec.model.max_lora_rank,
                          max_loras=len(names), max_cpu_loras=len(names))


def adapter_request(spec: BuildSpec, name: str) -> dict[str, JsonValue]:
    """The request fields that select adapter `name` on trtllm-serve: `lora_request` with the adapter's name, a
    distinct integer id (its place in model.adapters) and its folder as the server sees it."""
    index = next(i for i, a in enumerate(spec.model.adapters) if a.name == name)
    return {"lora_request": {"lora_name": name, "lora_int_id": index, "lora_path": adapter_path(name)}}


def bundle_adapters(bundle: Path, adapter_dirs: dict[str, Path] | None) -> list[str]:
    """The fetched adapters copied (cloned where the filesystem can; never hard-linked: a local adapter's fetched
    folder is the user's own) into <bundle>/adapters/<name>, published and digested with the unit; their names."""
    names = []
    for name, folder in (adapter_dirs or {}).items():
        shutil.copytree(folder, bundle / adapter_path(name), copy_function=clone_or_copy)
        names.append(name)
    return names


def bundled_adapters(bundle_dir: Path, info: BundleInfo) -> dict[str, str] | None:
    """name → folder of a served-adapter bundle's adapters (adapter_mode serve, either lane), from its bundle.json
    (outside input); None for any other. A recorded name that is not a plain file name, or whose folder is missing,
    is refused."""
    names = info.params.get("adapters")  # JSON edge: the recorded params
    if names is None:
        return None
    out: dict[str, str] = {}
    if not isinstance(names, list) or not names or len(names) > 1000:
        names = [None]
    for name in names:
        try:
            check_name(name if isinstance(name, str) else "", "adapter")
        except ValueError:
            name = None
        folder = bundle_dir / BUNDLE_ADAPTERS_DIR / name if isinstance(name, str) else None
        if not isinstance(name, str) or folder is None or not folder.is_dir() or name in out:
            raise InputError(f"{bundle_dir / BUNDLE_INFO}: params.adapters is not a set of adapters this lane "
                             "bundled; rebuild it")
        out[name] = str(folder.resolve())
    return out


def release_problems(spec: BuildSpec, version: str | None) -> list[tuple[str, str]]:
    """adapter_mode serve on a release before the evidence of `lora_config` (the registry's range)."""
    if not spec.model.serves_adapters or version is None:
        return []
    entry = flag(LLM_API, "lora_config")
    if entry.exists_in(version):
        return []
    return [("model.adapter_mode", f"serving LoRA adapters per request needs the LLM API's lora_config, which "
                                   f"TensorRT-LLM {version} does not show (from {LORA_SINCE}: {entry.refs[0]}): pin "
                                   f"toolchain.trtllm_version {CHECKED} (or another release from {LORA_SINCE} on), "
                                   "or use adapter_mode: merge (the merged checkpoint needs no LoRA support)")]


def module_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """Adapters whose target_modules TensorRT-LLM's default module map does not cover (adapter_config.json alone;
    an unreadable one is refused by the common preflight, enginefoundry/inputs/adapters.py)."""
    if not spec.model.serves_adapters:
        return []
    problems = []
    for i, adapter in enumerate(spec.model.adapters):
        cfg, _ = read_adapter_config(spec, adapter)
        if cfg is None or cfg.target_modules is None or cfg.target_modules == ALL_LINEAR:
            continue
        if isinstance(cfg.target_modules, str):
            problems.append((f"model.adapters.{i}", f"adapter {adapter.name} names its target modules by the "
                                                    f"pattern {cfg.target_modules!r}, which lane trtllm cannot map "
                                                    "to TensorRT-LLM's modules: list them by name "
                                                    f"({', '.join(sorted(MAPPED_HF_MODULES))}), or use "
                                                    "adapter_mode: merge"))
            continue
        unmapped = sorted(set(cfg.target_modules) - MAPPED_HF_MODULES)
        if unmapped:
            problems.append((f"model.adapters.{i}", f"adapter {adapter.name} targets {unmapped}, which TensorRT-LLM's "
                                                    "default module map does not cover (it maps "
                                                    f"{', '.join(sorted(MAPPED_HF_MODULES))}; {REF_LORA_CONFIG}): "
                                                    "use an adapter of those modules, or adapter_mode: merge"))
    return problems


__all__ = [
    "BUNDLE_ADAPTERS_DIR",
    "DEFAULT_TRTLLM_TO_HF",
    "LORA_CKPT_SOURCE",
    "MAPPED_HF_MODULES",
    "LoraConfigKeys",
    "adapter_path",
    "adapter_request",
    "bundle_adapters",
    "bundled_adapters",
    "lora_config",
    "module_problems",
    "release_problems",
]
