"""`validate` refuses a smoke.accuracy_margin that the prompt set's size cannot meet, as the gate's "sample size"
rule would after the build (issue 25), and names the smallest margin that would do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.spec import load_spec
from enginefoundry.validate import validate_deep
from tests.support.paths import CONFIGS, TINY_PROMPTS


def _spec(tmp_path: Path, **smoke: object) -> Path:
    doc = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    doc["model"]["source"] = str(CONFIGS.parent / "tests" / "fixtures" / "tiny-chat" / "model")
    doc["smoke"].update({"prompts": str(TINY_PROMPTS), **smoke})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_margin_the_prompt_set_cannot_meet_is_refused_before_the_build(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as refused:
        validate_deep(load_spec(_spec(tmp_path, accuracy_margin=0.02)))
    (field, message), = refused.value.problems
    assert field == "smoke.accuracy_margin"
    assert message.startswith("fp32: margin 0.02 needs 306 graded prompts"), message
    assert "tiny-chat.jsonl has 108; set smoke.accuracy_margin to 0.05 or more" in message
    validate_deep(load_spec(_spec(tmp_path, accuracy_margin=0.05)))  # the margin it names is enough
    validate_deep(load_spec(_spec(tmp_path, accuracy_margin=0.02, small_sample="warn")))  # a warning, by choice
