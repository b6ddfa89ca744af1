"""What every lane's preflight speaks: the model's shape (from its Hugging Face config.json) and one check's verdict.

Lanes add their own checks (`Lane.preflight_checks`) in these terms; planning.preflight runs them with the rules
that hold for every lane.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from enginefoundry.errors import InputError
from enginefoundry.gpu.precisions import TORCH_BYTES
from enginefoundry.inputs.model_config import MAX_CONFIG_BYTES
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import HfModelConfig

# --- the model's shape ---------------------------------------------------------------------------------------

class ModelShape(BaseModel):
    """What the estimates need from a Hugging Face config.json."""

    architectures: list[str] = Field(default_factory=list)
    model_type: str | None = None
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    num_experts: int = 1
    # Mixture of experts: the routed experts' FFN width (Qwen3-MoE / DeepSeek `moe_intermediate_size`; Mixtral's
    # experts are `intermediate_size` wide), experts per token, always-on shared experts' width, dense layers.
    moe_intermediate_size: int | None = None
    experts_per_token: int = 1
    shared_intermediate_size: int = 0
    dense_layers: int = 0
    dtype: str | None = None
    max_position_embeddings: int | None = None
    rope_scaling: HfModelConfig | None = None  # config.json's rope_scaling object

    @classmethod
    def from_config(cls, config: HfModelConfig) -> ModelShape:
        text = config.get("text_config")
        cfg: HfModelConfig = text if isinstance(text, dict) else config
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                architectures=list(config.get("architectures") or []),
                model_type=config.get("model_type"),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                hidden_size=hidden,
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate_size=int(cfg["intermediate_size"]),
                vocab_size=int(cfg["vocab_size"]),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
                gated_mlp=str(cfg.get("hidden_act", "silu")) in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu"),
                num_experts=_experts(cfg),
                moe_intermediate_size=cfg.get("moe_intermediate_size"),
                experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
                shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
                or int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0),
                dense_layers=_dense_layers(cfg),
                # transformers 5 writes `dtype`; older configs `torch_dtype`.
                dtype=cfg.get("dtype") or cfg.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype"),
                max_position_embeddings=cfg.get("max_position_embeddings"),
                rope_scaling=cfg.get("rope_scaling"),
            )
        except KeyError as err:
            raise InputError(f"config.json lacks {err.args[0]}: not a decoder-only transformer config") from None

    @property
    def dtype_bytes(self) -> int:
        return TORCH_BYTES.get(str(self.dtype), 2)

    @property
    def context_limit(self) -> int | None:
        """Longest sequence the model supports (linear/dynamic RoPE scaling extends max_position_embeddings)."""
        if not self.max_position_embeddings:
            return None
        rope = self.rope_scaling or {}
        kind = rope.get("rope_type") or rope.get("type")
        if kind in ("linear", "dynamic") and rope.get("factor"):
            return int(self.max_position_embeddings * float(rope["factor"]))
        return int(self.max_position_embeddings)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def params(self) -> dict[str, int]:
        """Parameter count by part (biases ignored: Llama-family models have none). `attention`, `experts` (every
        routed expert of every MoE layer) and `mlp` (dense layers' and shared experts' FFNs, routers) are the linear
        layers; a dense model has no `experts`."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * self.num_attention_heads * hd * 2 + h * self.num_key_value_heads * hd * 2
        ffn = 3 if self.gated_mlp else 2
        layers = self.num_hidden_layers
        if self.is_moe:
            moe_layers = max(0, layers - self.dense_layers)
            expert = ffn * h * (self.moe_intermediate_size or self.intermediate_size)
            experts = moe_layers * expert * self.num_experts
            mlp = (self.dense_layers * ffn * h * self.intermediate_size
                   + moe_layers * (ffn * h * self.shared_intermediate_size + h * self.num_experts))
        else:
            experts, mlp = 0, layers * ffn * h * self.intermediate_size
        return {
            "embedding": self.vocab_size * h,
            "attention": layers * attn,
            "experts": experts,
            "mlp": mlp,
            "norms": layers * 2 * h + h,
            "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h,
        }

    def decoder_layer_params(self) -> dict[str, int]:
        """One decoder layer by part (a mixture-of-experts model's: an MoE layer, every routed expert), as params()
        names them: what one MTP module repeats of the model (it shares the embedding and lm_head)."""
        h, hd = self.hidden_size, self.head_dim
        ffn = 3 if self.gated_mlp else 2
        if self.is_moe:
            experts = ffn * h * (self.moe_intermediate_size or self.intermediate_size) * self.num_experts
            mlp = ffn * h * self.shared_intermediate_size + h * self.num_experts
        else:
            experts, mlp = 0, ffn * h * self.intermediate_size
        return {"attention": h * self.num_attention_heads * hd * 2 + h * self.num_key_value_heads * hd * 2,
                "experts": experts, "mlp": mlp, "norms": 2 * h}

    def param_count(self) -> int:
        """Total parameters: what the checkpoint holds and the GPUs load."""
        return sum(self.params().values())

    def active_param_count(self) -> int:
        """Parameters one token passes through: the routed experts count `experts_per_token` of `num_experts`."""
        parts = self.params()
        routed = parts["experts"] * min(self.experts_per_token, self.num_experts) // max(self.num_experts, 1)
        return sum(parts.values()) - parts["experts"] + routed


def _experts(cfg: HfModelConfig) -> int:
    """Routed experts (enginefoundry.inputs.model_config.expert_count reads the same keys); 1 for a dense model."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return 1


def _dense_layers(cfg: HfModelConfig) -> int:
    """Layers of an MoE model with a dense FFN: DeepSeek's first_k_dense_replace, Qwen-MoE's mlp_only_layers."""
    only = cfg.get("mlp_only_layers")
    return int(cfg.get("first_k_dense_replace") or 0) + (len(only) if isinstance(only, list) else 0)


def read_model_config(checkpoint_dir: Path) -> HfModelConfig:
    """A checkpoint's Hugging Face config.json, parsed within bounds (size, depth, digits); an `InputError` names the
    file when it is missing, not JSON, or not a JSON object."""
    path = Path(checkpoint_dir) / "config.json"
    try:
        config = parse_json(path.read_bytes(), what=str(path), max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise InputError(f"{path} does not exist: the checkpoint folder needs a Hugging Face config.json") from None
    except DocumentError as err:
        raise InputError(f"{err}: the checkpoint folder needs a Hugging Face config.json") from None
    if not isinstance(config, dict):
        raise InputError(f"{path} is not a JSON object: the checkpoint folder needs a Hugging Face config.json")
    return config


class Check(BaseModel):
    name: str
    ok: bool
    message: str
    fix: str | None = None


def checkpoint_shape(checkpoint_dir: Path | None) -> ModelShape | None:
    """The shape read from `checkpoint_dir`'s config.json, None where there is no folder or no config.json."""
    if checkpoint_dir is None or not (checkpoint_dir / "config.json").is_file():
        return None
    return ModelShape.from_config(read_model_config(checkpoint_dir))
