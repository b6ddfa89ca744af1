"""The engine lane against the fake TensorRT-LLM toolchains' own scripts (processes: moved out of
tests/unit/test_trtllm_audit.py, the unit tier starts none)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from enginefoundry.lanes import triton
from tests.support.fill_template import FILL_STAND_IN
from tests.support.paths import FIXTURES

FAKE = FIXTURES / "fake-trtllm"


RELEASES = {"1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1"}


PROMPT_KEY = "prompt_embedding_table_data_type"


def _triton_tree(tmp_path: Path, release: str) -> Path:
    root = tmp_path / f"triton-{release}"
    shutil.copytree(FAKE / release / "triton" / "all_models", root / "all_models")
    (root / triton.FILL_TEMPLATE).parent.mkdir(parents=True)
    (root / triton.FILL_TEMPLATE).write_text(FILL_STAND_IN)
    return root


@pytest.mark.parametrize("release", list(RELEASES))
def test_the_engine_lane_fills_every_structural_key_of_each_release(tmp_path, release):
    """fill_template.py asserts each given key exists, and Triton rejects an unfilled data_type: the fill must
    match the release's templates exactly, bls included."""
    params = triton.TritonParams(engine_dir="/m/engine", tokenizer_dir="/m/tokenizer", triton_max_batch_size=8,
                                 kv_cache_free_gpu_mem_fraction=0.9, model_dtype="bfloat16")
    repo = tmp_path / "repo"
    cmds = triton.build_repository(_triton_tree(tmp_path, release), repo, params, log_dir=tmp_path / "logs")
    assert triton.check_repository(repo) == []
    bls = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    filled = {m: k for c in cmds for m, k in c.template_keys.items()}
    if release == "1.0":
        assert PROMPT_KEY not in filled["tensorrt_llm_bls"] and PROMPT_KEY not in filled["tensorrt_llm"]
    else:
        assert f'name: "{PROMPT_KEY}" data_type: TYPE_BF16' in bls
        assert PROMPT_KEY in filled["tensorrt_llm_bls"]
