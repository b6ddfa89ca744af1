"""What a build consumes, before any lane runs: the units of a spec (matrix × targets, cache keys), the model's
sources (hub, S3, local), its config and shape, a pre-quantized source's own quantization, LoRA adapters, the
toolchain probe and the checkpoint cast. Below the lanes, the smoke gate and the benchmark; above the store.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.inputs.adapters import (
        adapter_problems,
        fetch_adapters,
        merged_source,
        pinned_adapters,
        served_source,
    )
    from enginefoundry.inputs.checkpoint_cast import cast_checkpoint
    from enginefoundry.inputs.model_config import (
        expert_count,
        hub_config,
        lookup,
        model_config_for,
        read_config,
    )
    from enginefoundry.inputs.model_shape import Check, ModelShape, checkpoint_shape, read_model_config
    from enginefoundry.inputs.quantized_source import (
        ALGO_PRECISION,
        DEQUANTIZED,
        MAX_QUANT_CONFIG_BYTES,
        SourceQuantization,
        read_json_bounded,
        read_quantization,
        refuse_contradiction,
        spec_quantization,
        spec_quantization_problems,
        write_dequantized,
    )
    from enginefoundry.inputs.sources import (
        SourceIdentity,
        SourceSnapshot,
        check_local,
        fetch,
        probe,
        remove_stale_partials,
    )
    from enginefoundry.inputs.toolchain import (
        LLMAPI_FILES,
        LLMAPI_TEMPLATE,
        ToolchainInfo,
        ToolHelp,
        ToolSurface,
        UnsupportedByRelease,
        check_against_surface,
        detect_toolchain,
        installed_version,
        parse_version,
        probe_surface,
        require_trtllm,
        template_keys,
    )
    from enginefoundry.inputs.units import (
        KeyComponents,
        SourceDigests,
        Unit,
        checkpoint_key_components,
        expand_units,
        key_of,
        target_identity,
        toolchain_identity,
        unit_key_components,
    )

__all__ = [
    "ALGO_PRECISION",
    "DEQUANTIZED",
    "LLMAPI_FILES",
    "LLMAPI_TEMPLATE",
    "MAX_QUANT_CONFIG_BYTES",
    "Check",
    "KeyComponents",
    "ModelShape",
    "SourceDigests",
    "SourceIdentity",
    "SourceQuantization",
    "SourceSnapshot",
    "ToolHelp",
    "ToolSurface",
    "ToolchainInfo",
    "Unit",
    "UnsupportedByRelease",
    "adapter_problems",
    "cast_checkpoint",
    "check_against_surface",
    "check_local",
    "checkpoint_key_components",
    "checkpoint_shape",
    "detect_toolchain",
    "expand_units",
    "expert_count",
    "fetch",
    "fetch_adapters",
    "hub_config",
    "installed_version",
    "key_of",
    "lookup",
    "merged_source",
    "model_config_for",
    "parse_version",
    "pinned_adapters",
    "probe",
    "probe_surface",
    "read_config",
    "read_json_bounded",
    "read_model_config",
    "read_quantization",
    "refuse_contradiction",
    "remove_stale_partials",
    "require_trtllm",
    "served_source",
    "spec_quantization",
    "spec_quantization_problems",
    "target_identity",
    "template_keys",
    "toolchain_identity",
    "unit_key_components",
    "write_dequantized",
]

__getattr__, __dir__ = lazy_face(__name__)
