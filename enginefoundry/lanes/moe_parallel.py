"""Mixture-of-experts parallelism of a variant: the world-size rules, the expert-count rule and the LLM API keys.

TensorRT-LLM's rules, read from its source (trtllm_flags.REF_MAPPING, REF_MOE_LLM_ARGS):
- the MoE layers split the tp ranks again: moe_tp × moe_ep (× moe_cluster, which enginefoundry never sets) must equal
  tp (MappingBase raises "moe_tp_size * moe_ep_size * moe_cluster_size must equal to moe_world_size", moe_world_size
  = tp without context parallelism); an unset moe_tp is tp // moe_ep;
- attention data parallelism reuses the tp ranks as dp ranks (`dp_size = tp_size if enable_attention_dp else 1`): with
  tp 1 there is nothing to parallelise;
- each expert-parallel rank holds num_experts // moe_ep experts (`ep_experts`): an expert count that moe_ep does not
  divide would drop experts, so it is refused (checked at preflight, where the model's config.json is read).

The lanes call `variant_problems` from `validate_options` (spec fields only, before any download) and
`expert_check` from preflight (with the expert count of the model's config.json, enginefoundry.inputs.model_config).
"""

from __future__ import annotations

from enginefoundry.inputs.model_shape import Check
from enginefoundry.lanes.trtllm_flags import REF_MAPPING
from enginefoundry.schemas.loose import TrtllmConfig
from enginefoundry.spec import BuildSpec, Variant

MAPPING_SOURCE = "tensorrt_llm/mapping.py@b35ac1b6 (MappingBase)"
# What attention DP replicates, for the memory estimate: the attention modules build their own Mapping with tp 1
# (`if config.mapping.enable_attention_dp: tp_size = 1`), and the lm_head (and a tied embedding) drop to tp 1 unless
# enable_lm_head_tp_in_adp (mapping.py@b35ac1b6, default False), which enginefoundry does not set.
MOE_ADP_REPLICATES = ("tensorrt_llm/_torch/modules/attention.py@c6d3bb2aae305e0b5ac1b97b7954dcf87d653322 (Attention: "
                      "tp_size = 1 under enable_attention_dp; lm_head tp 1 unless enable_lm_head_tp_in_adp)")

# docs/trtllm-compat.md (enginefoundry.lanes.compat renders these with each key's registry entry).
DOC_FIELDS = (
    ("moe_ep", "moe_expert_parallel_size", "moe_ep > 1 or moe_tp set (written with moe_tensor_parallel_size)"),
    ("moe_tp", "moe_tensor_parallel_size", "moe_ep > 1 or moe_tp set; unset: tp / moe_ep"),
    ("attention_dp", "enable_attention_dp", "attention_dp: true"),
)
DOC_RULES = (
    f"`moe_tp × moe_ep ≠ tp` (field `moe_tp`), or `moe_ep` not dividing `tp` without `moe_tp` (field `moe_ep`): the "
    f"MoE layers split the tp ranks again ({REF_MAPPING})",
    "`attention_dp: true` with `tp: 1` (field `attention_dp`): the dp ranks are the tp ranks (dp_size = tp_size)",
    "an expert count (config.json `num_experts`, `num_local_experts` or `n_routed_experts`, read as `search` reads "
    "it) that `moe_ep` does not divide, or `moe_ep`/`moe_tp` on a dense model (preflight check `experts_divisible`)",
    "`moe_ep`, `moe_tp` or `attention_dp` on lane `reference` (one device, every expert in one model) or "
    "`trtllm-engine` (its MoE flags are not registered): the fix is to remove the field or use lane `trtllm`",
    "memory: every expert is loaded (total, not active, parameters); routed experts are split over moe_ep × moe_tp "
    "ranks, the rest over tp, unless attention DP replicates attention, dense FFNs, embedding and lm_head on every "
    "rank (each rank's KV cache then holds every KV head of its own requests)",
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def variant_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """(field, message with the fix) for every variant whose MoE fields break TensorRT-LLM's world-size rules."""
    out: list[tuple[str, str]] = []
    for i, v in enumerate(spec.variants):
        out += [(f"variants.{i}.{field}", message) for field, message in _rules(v)]
    return out


def _rules(v: Variant) -> list[tuple[str, str]]:
    out = []
    if v.moe_tp is not None:
        if v.moe_tp * v.moe_ep != v.tp:
            fix = (f"set moe_tp: {v.tp // v.moe_ep} (or leave it out: tp // moe_ep)" if v.tp % v.moe_ep == 0
                   else f"pick moe_ep × moe_tp = {v.tp} (moe_ep in {_divisors(v.tp)})")
            out.append(("moe_tp", f"moe_tp {v.moe_tp} × moe_ep {v.moe_ep} = {v.moe_tp * v.moe_ep} must equal tp "
                                  f"{v.tp}: the MoE layers split the tp ranks ({MAPPING_SOURCE}): {fix}"))
    elif v.tp % v.moe_ep:
        out.append(("moe_ep", f"moe_ep {v.moe_ep} must divide tp {v.tp}: the experts are split over the tp ranks "
                              f"(moe_tp × moe_ep = tp, {MAPPING_SOURCE}): use moe_ep in {_divisors(v.tp)}, or raise "
                              f"tp to a multiple of {v.moe_ep}"))
    if v.attention_dp and v.tp < 2:
        out.append(("attention_dp", "attention data parallelism uses the tp ranks as its dp ranks (dp_size = tp_size, "
                                    f"{MAPPING_SOURCE}) and tp is 1: set tp ≥ 2 (with moe_ep, e.g. tp: 8, moe_ep: 8), "
                                    "or remove attention_dp"))
    return out


def unsupported_problems(spec: BuildSpec, lane: str, why: str) -> list[tuple[str, str]]:
    """A lane without MoE parallelism: every variant that sets a MoE field is refused, naming the field."""
    out = []
    for i, v in enumerate(spec.variants):
        for field, given in (("moe_ep", v.moe_ep > 1), ("moe_tp", v.moe_tp is not None),
                             ("attention_dp", v.attention_dp)):
            if given:
                out.append((f"variants.{i}.{field}", f"lane {lane} {why}: remove {field} from the variant (an MoE "
                                                     "model runs there with its experts on every rank), or use lane "
                                                     "trtllm (moe_ep, moe_tp, attention_dp)"))
    return out


def llm_api_options(v: Variant) -> TrtllmConfig:
    """The LLM API keys of the variant's MoE parallelism: none for a variant that sets none (TensorRT-LLM's defaults:
    moe_tp = tp, moe_ep = 1, no attention DP), else the resolved sizes, written out."""
    out: TrtllmConfig = {}
    if v.moe_ep > 1 or v.moe_tp is not None:
        out["moe_expert_parallel_size"] = v.moe_ep
        out["moe_tensor_parallel_size"] = v.moe_tp_size
    if v.attention_dp:
        out["enable_attention_dp"] = True
    return out


def expert_check(v: Variant, experts: int) -> Check | None:
    """The model's routed-expert count against the variant's moe_ep (None when the variant sets no MoE field).
    `experts`: 0 for a dense model (enginefoundry.inputs.model_config.expert_count)."""
    if not (v.moe_ep > 1 or v.moe_tp is not None):
        return None
    if experts == 0:
        return Check(name="experts_divisible", ok=False,
                     message=f"moe_ep {v.moe_ep} / moe_tp {v.moe_tp_size}: the model's config.json names no routed "
                             "experts (num_experts, num_local_experts or n_routed_experts): a dense model",
                     fix="remove moe_ep and moe_tp from the variant (tp alone splits a dense model)")
    if experts % v.moe_ep:
        fits = [d for d in _divisors(experts) if d <= max(v.tp, 1) and v.tp % d == 0]
        return Check(name="experts_divisible", ok=False,
                     message=f"{experts} experts are not divisible by moe_ep {v.moe_ep}: each expert-parallel rank "
                             f"holds num_experts // moe_ep of them ({REF_MAPPING.split(' (')[0]} ep_experts), so "
                             f"{experts % v.moe_ep} would be lost",
                     fix=f"moe_ep in {fits} for tp {v.tp}")
    return Check(name="experts_divisible", ok=True,
                 message=f"{experts} experts over moe_ep {v.moe_ep}: {experts // v.moe_ep} per rank, each split over "
                         f"moe_tp {v.moe_tp_size}")
