"""gpu/placement.check_toolchain: a worker refuses a unit whose key was computed with another toolchain."""

from __future__ import annotations

import pytest

from enginefoundry.errors import PreflightError
from enginefoundry.gpu.placement import check_toolchain


def test_the_same_versions_in_any_order_and_no_planned_key_pass():
    check_toolchain("u", {"a": "1", "b": "2"}, {"b": "2", "a": "1"})
    check_toolchain("u", {}, {"tensorrt_llm": "1.0"})  # no key components: nothing to compare


def test_a_different_missing_or_extra_version_is_named_with_the_fix():
    with pytest.raises(PreflightError) as err:
        check_toolchain("tiny-fp16", {"tensorrt_llm": "1.0", "torch": "2.5"}, {"tensorrt_llm": "1.1", "extra": "x"})
    assert str(err.value) == ("unit tiny-fp16: this worker's toolchain differs from the one its key was computed with "
                              "(extra None → x, tensorrt_llm 1.0 → 1.1, torch 2.5 → None); run workers and the parent "
                              "from the same image")
