"""What docs/facts/trtllm.md says about TensorRT-LLM flags, as sets the flag tests compare against."""

from __future__ import annotations

# facts/trtllm.md §1 timeline and §4 "Flags that no longer exist": flag → (release, replacement words).
FACTS_REMOVED = {
    "use_custom_all_reduce": ("0.12", "runtime"),
    "paged_kv_cache": ("0.13", "--kv_cache_type paged"),
    "tp_size": ("0.12", "variants[].tp"),
    "pp_size": ("0.12", "variants[].pp"),
    "cp_size": ("0.12", "variants[].tp"),
    "max_output_len": ("0.12", "max_seq_len"),
    "multi_block_mode": ("0.12", "multi_block_mode"),
    "context_fmha_fp32_acc": ("0.12", "enable_context_fmha_fp32_acc"),
    "builder_opt": ("0.14", "no replacement"),
    "builder_force_num_profiles": ("0.15", "BUILDER_FORCE_NUM_PROFILES"),
    "enable_xqa": ("0.16", "no replacement"),
    "strongly_typed": ("0.11", "strongly_typed=True"),
    "weight_only_precision": ("0.11", "int8_wo"),
    "use_context_fmha_for_generation": ("0.11", "no replacement"),
    "attention_qk_half_accumulation": ("0.11", "no replacement"),
    "auto_parallel": ("1.2.0", "PR #8329"),
    "gpus_per_node": ("1.2.0", "PR #8329"),
    "cluster_key": ("1.2.0", "#1807"),
}

# facts §4: every trtllm-build flag of 1.0 – 1.2.x the project may emit must be one of these.
FACTS_BUILD_FLAGS = {
    "checkpoint_dir", "model_config", "build_config", "output_dir", "max_batch_size", "max_input_len", "max_seq_len",
    "max_beam_width", "max_num_tokens", "opt_num_tokens", "kv_cache_type", "input_timing_cache",
    "output_timing_cache", "profiling_verbosity", "strip_plan", "weight_sparsity", "weight_streaming", "fast_build",
    "workers", "log_level", "gemm_plugin", "gpt_attention_plugin", "bert_attention_plugin", "gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin", "lora_plugin", "moe_plugin", "nccl_plugin", "context_fmha", "remove_input_padding",
    "use_paged_context_fmha", "use_fp8_context_fmha", "paged_state", "use_fused_mlp", "multiple_profiles",
    "tokens_per_block",
}
FACTS_CONVERT_FLAGS = {
    "model_dir", "meta_ckpt_dir", "tp_size", "pp_size", "cp_size", "dtype", "use_weight_only",
    "weight_only_precision", "group_size", "per_group", "smoothquant", "int8_kv_cache", "fp8_kv_cache", "use_fp8",
    "use_nvfp4", "calib_dataset", "calib_size", "calib_max_seq_length", "load_by_shard", "load_model_on_cpu",
    "output_dir", "workers",
}
FACTS_SERVE_FLAGS = {
    "tokenizer", "host", "port", "backend", "max_batch_size", "max_num_tokens", "max_seq_len", "tp_size", "pp_size",
    "kv_cache_free_gpu_memory_fraction", "extra_llm_api_options",
    "config",  # facts §1 timeline: Nov 2025, an alias of --extra_llm_api_options (PR #9104)
}
