"""The layouts of ModelOpt's FP8 and NVFP4 exports read back into float32 weights, and the engine's input
quantization as forward hooks (enginefoundry/inputs/dequantize.py; ModelOpt's own quantizer is the oracle in
tests/integration/test_prequantized_fp8_nvfp4.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from enginefoundry.errors import ToolError
from enginefoundry.inputs.dequantize import (
    ACTIVATIONS_FILE,
    E2M1_GRID,
    ActivationQuantization,
    dequantize,
    install,
    quantize_fp8,
    quantize_nvfp4,
    read_activations,
    round_e2m1,
    unpack_e2m1,
    write_activations,
)


def test_e2m1_codes_unpack_low_nibble_first_with_the_sign_in_bit_3():
    packed = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8)  # codes 1, 2 | 7, 15
    assert unpack_e2m1(packed).tolist() == [[0.5, 1.0, 6.0, -6.0]]


def test_fp8_and_nvfp4_weights_are_codes_times_their_scales_and_inputs_are_kept():
    w = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(torch.float8_e4m3fn)
    tensors, done = dequantize({"l.weight": w, "l.weight_scale": torch.tensor(0.25), "l.input_scale": torch.tensor(0.5),
                       "norm.weight": torch.ones(2, dtype=torch.bfloat16)}, "FP8", None)
    assert tensors["l.weight"].tolist() == [[0.25, -0.5], [0.125, 112.0]]
    assert tensors["norm.weight"].dtype == torch.float32
    assert done.layers == 1 and done.activations is not None and done.activations.input_scales == {"l": 0.5}
    codes = torch.tensor([[0x21] * 8], dtype=torch.uint8)  # one row of 16 inputs: 0.5, 1.0 repeated
    scales = torch.tensor([[2.0]]).to(torch.float8_e4m3fn)
    nv_tensors, nv = dequantize({"l.weight": codes, "l.weight_scale": scales, "l.weight_scale_2": torch.tensor(0.5),
                     "l.input_scale": torch.tensor(0.1)}, "NVFP4", 16)
    assert nv_tensors["l.weight"].tolist() == [[0.5, 1.0] * 8]
    assert nv.activations is not None and nv.activations.block_size == 16


@pytest.mark.parametrize(("tensors", "said"), [
    ({"l.weight": torch.zeros(2, 2).to(torch.float8_e4m3fn), "l.weight_scale": torch.tensor(1.0)},
     "no positive input_scale"),
    ({"l.weight": torch.zeros(2, 2).to(torch.float8_e4m3fn)}, "has no l.weight_scale"),
    ({"l.weight": torch.zeros(2, 2).to(torch.float8_e4m3fn), "l.weight_scale": torch.ones(2),
      "l.input_scale": torch.tensor(1.0)}, "one scale"),
    ({"l.weight": torch.zeros(2, 2), "l.k_scale": torch.tensor(1.0)}, "a quantization parameter FP8 does not have"),
])
def test_what_the_layout_does_not_have_is_refused(tensors: dict[str, torch.Tensor], said: str):
    with pytest.raises(ToolError, match=said):
        dequantize(tensors, "FP8", None)
    with pytest.raises(ToolError, match="not dequantized here"):
        dequantize({}, "W4A8_AWQ", None)


def test_an_fp8_input_lands_on_the_e4m3_grid_times_its_scale_and_clips_at_448():
    # 1.3 → 1.25 (3 mantissa bits), 330 → 320 (steps of 32 above 256), 2e6 → 448 (the largest finite e4m3)
    q = quantize_fp8(torch.tensor([0.65, 165.0, -1e6, 0.0]), 0.5)
    assert q.tolist() == [0.625, 160.0, -224.0, 0.0]


def test_an_nvfp4_input_is_e2m1_values_times_an_e4m3_block_scale_per_16():
    torch.manual_seed(0)
    x = torch.randn(2, 32)
    x[1, 16:] = 0  # a block of zeros stays zeros
    s = float(x.abs().max()) / (6 * 448)
    q = quantize_nvfp4(x, s)
    assert torch.equal(q[1, 16:], torch.zeros(16))
    for row, lo in ((0, 0), (0, 16), (1, 0)):
        block = x[row, lo:lo + 16]
        step = (block.abs().max() / 6 / s).to(torch.float8_e4m3fn).float() * s
        values = (q[row, lo:lo + 16] / step).abs()
        assert all(min(abs(v - g) for g in E2M1_GRID) < 1e-5 for v in values.tolist())
    assert (q - x).abs().max() < x.abs().max() / 4 and not torch.equal(q, x)
    with pytest.raises(ToolError, match="not whole blocks of 16"):
        quantize_nvfp4(torch.ones(3, 20), s)
    assert round_e2m1(torch.tensor([0.74, 0.76, 2.5, 5.1, -7.0])).tolist() == [0.5, 1.0, 2.0, 6.0, -6.0]


def test_hooks_quantize_each_named_linears_input_and_refuse_another_models_scales(tmp_path: Path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    x = torch.randn(2, 16)
    plain = model(x)
    acts = ActivationQuantization(quant_algo="NVFP4", block_size=16, input_scales={"0": 0.01, "1": 0.02})
    write_activations(tmp_path, acts)
    assert read_activations(tmp_path) == acts
    assert install(model, acts) == 2
    assert not torch.equal(model(x), plain)
    with pytest.raises(ToolError, match="names modules this model does not have"):
        install(model, ActivationQuantization(quant_algo="FP8", input_scales={"lm_head": 1.0}))
    (tmp_path / ACTIVATIONS_FILE).write_text('{"quant_algo": "INT8", "input_scales": {}}')
    with pytest.raises(ToolError, match="not an activation quantization this project wrote"):
        read_activations(tmp_path)
    assert read_activations(tmp_path / "absent") is None
