"""The flag registry carries its evidence, docs/trtllm-compat.md is generated from it, and `--help` of both
upstream formats (argparse, click) is parsed into flags and choices."""

from __future__ import annotations

import argparse
import dataclasses

import click
from click.testing import CliRunner

from enginefoundry.inputs.toolchain import parse_help
from enginefoundry.lanes import compat
from enginefoundry.lanes.trtllm_flags import EMITTED, REMOVED, SERVE, Flag


def test_every_registry_entry_has_a_release_range_and_an_upstream_reference():
    assert compat.registry_problems() == []
    assert len(EMITTED) > 60 and all(f.refs for f in EMITTED) and all(r.refs for r in REMOVED.values())


def test_an_entry_without_evidence_is_refused():
    bare = Flag(SERVE, "made_up")
    assert compat.entry_problems(bare) == [f"{SERVE} made_up: no upstream reference (file@commit, PR or release note)"]
    vague = dataclasses.replace(bare, refs=("I remember it",))
    assert "names no file, commit, PR or release note" in compat.entry_problems(vague)[0]
    bad_range = dataclasses.replace(bare, refs=("PR #1",), since="latest")
    assert "release range unreadable" in compat.entry_problems(bad_range)[0]


def test_the_committed_compat_page_is_the_generated_one():
    assert compat.DOC.read_text() == compat.render(), "run: python -m enginefoundry.lanes.compat"
    page = compat.render()
    assert "| `--backend trt` | 1.0 – 1.0.x | ✓ | — | — | — |" in page  # 0.18.2 had pytorch only (docs 0.18.2)
    assert "| `--backend tensorrt` | 1.1 – 1.2.x | — | ✓ | ✓ | — |" in page
    assert "| `TLLM_AUTOTUNER_CACHE_PATH` | 1.1 – now | — | ✓ | ✓ | ✓ |" in page
    assert "| `--calib_seq` | ModelOpt 0.39 – now | — | ✓ | ✓ |" in page


def test_argparse_help_is_parsed():
    parser = argparse.ArgumentParser(prog="quantize.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model_dir", help="see also --not_a_flag_of_this_tool")
    parser.add_argument("--qformat", default="full_prec", choices=["fp8", "int4_awq", "full_prec"])
    parser.add_argument("--max_seq_len", "--max_decoder_seq_len", dest="max_seq_len", type=int)
    parser.add_argument("--kv_cache_dtype", choices=["int8", "fp8", None])
    parsed = parse_help(parser.format_help())
    assert set(parsed.flags) == {"help", "model_dir", "qformat", "max_seq_len", "max_decoder_seq_len",
                                 "kv_cache_dtype"}
    assert parsed.choices["qformat"] == ["fp8", "int4_awq", "full_prec"]
    assert parsed.choices["kv_cache_dtype"] == ["int8", "fp8", "None"]


def test_click_help_is_parsed_with_a_banner_before_it():
    @click.command("serve")
    @click.argument("model")
    @click.option("--backend", type=click.Choice(["pytorch", "trt", "_autodeploy"]), default="pytorch",
                  help="The backend to use to serve the model. Mentions --tokenizer in passing.")
    @click.option("--tensor_parallel_size", "--tp_size", type=int, default=1)
    @click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", type=str)
    def serve(model, backend, tensor_parallel_size, extra_llm_api_options):
        pass

    text = "[TensorRT-LLM] TensorRT LLM version: 1.0.0\n" + CliRunner().invoke(serve, ["--help"],
                                                                             terminal_width=200).output
    parsed = parse_help(text)
    assert set(parsed.flags) == {"help", "backend", "tensor_parallel_size", "tp_size", "config",
                                 "extra_llm_api_options"}
    assert parsed.choices == {"backend": ["pytorch", "trt", "_autodeploy"]}


def test_the_surface_digest_ignores_error_texts_and_sees_flags():
    from enginefoundry.inputs.toolchain import ToolHelp, ToolSurface

    a = ToolSurface(tensorrt_llm="1.2.1", tools={"trtllm-build": ToolHelp(error="not found (log /tmp/x1/a.log)")},
                    errors={"torch": "ImportError at /tmp/x1"})
    b = ToolSurface(tensorrt_llm="1.2.1", tools={"trtllm-build": ToolHelp(error="not found (log /tmp/x2/a.log)")})
    assert a.digest() == b.digest()
    c = ToolSurface(tensorrt_llm="1.2.1", tools={"trtllm-build": ToolHelp(flags=["workers"])})
    d = ToolSurface(tensorrt_llm="1.2.1", tools={"trtllm-build": ToolHelp(flags=["workers", "fast_build"])})
    assert len({a.digest(), c.digest(), d.digest()}) == 3
