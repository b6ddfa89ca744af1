"""Prompt sets: JSONL, one prompt (or chat messages) per line, optional expected answer and match rule."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from enginefoundry.errors import InputError, first_problem

# A slice name: short, lowercase, words joined by hyphens ("long-context"); it appears in rule names and metric keys.
SLICE_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
SLICE_NAME_MAX = 32


class MatchRule(StrEnum):
    """How an answer is graded against `expected`. A chat model answers in sentences ("The capital of France is
    Paris."): `word` (the expected answer as a whole word or number, any case) and `contains` (as a substring, any
    case) grade those; `exact` (the whole answer, stripped) grades them wrong, and `validate` warns about it."""

    EXACT = "exact"
    CONTAINS = "contains"
    REGEX = "regex"
    WORD = "word"


# Matchers that grade a free-form chat answer; `exact` does not (prompt_set_warnings).
FREE_FORM = (MatchRule.WORD, MatchRule.CONTAINS, MatchRule.REGEX)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    content: str


class PromptCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    expected: str | None = None
    match: MatchRule = MatchRule.EXACT
    # Optional slice: the gate judges its divergence rules on the whole set and again on each named slice
    # (e.g. "long-context": rope and position breakages only show at a distance; docs/smoke-gate.md).
    # Excluded from model_dump: it groups prompts for the gate and is no input to the model, so the reference
    # answers' key (reference.prompts_digest) does not move with it and sets without slices keep their key.
    slice: str | None = Field(default=None, exclude=True)

    @field_validator("slice")
    @classmethod
    def _slice_name(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > SLICE_NAME_MAX or not SLICE_NAME.match(v)):
            raise ValueError(f"slice {v!r} is not a short lowercase name (letters, digits and hyphens, "
                             f"at most {SLICE_NAME_MAX} characters, e.g. 'long-context')")
        return v

    @model_validator(mode="after")
    def _one_input(self) -> PromptCase:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.match is MatchRule.REGEX and self.expected is not None:
            try:
                re.compile(self.expected)
            except re.error as err:  # not a ValueError: pydantic would let it escape as a crash
                raise ValueError(f"expected is not a valid regular expression ({err})") from None
        return self

    def chat(self) -> list[dict[str, str]]:
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def is_correct(self, answer: str) -> bool | None:
        """Task correctness against `expected`; None when the case has no expected answer."""
        if self.expected is None:
            return None
        answer = answer.strip()
        if self.match is MatchRule.EXACT:
            return answer == self.expected.strip()
        if self.match is MatchRule.CONTAINS:
            return self.expected.strip().lower() in answer.lower()
        if self.match is MatchRule.WORD:  # not inside a longer word or number: "4" is not in "14"
            return re.search(rf"(?<!\w){re.escape(self.expected.strip())}(?!\w)", answer, re.IGNORECASE) is not None
        return re.search(self.expected, answer) is not None


class PromptSet(BaseModel):
    path: str
    cases: list[PromptCase] = Field(min_length=1)

    @property
    def slices(self) -> list[str]:
        """The named slices, in the order they first appear."""
        return list(dict.fromkeys(c.slice for c in self.cases if c.slice is not None))


def prompt_set_warnings(prompts: PromptSet) -> list[str]:
    """What makes a prompt set's task accuracy mean little for a chat model: graded prompts whose matcher cannot grade
    a free-form answer (`exact`: 'The answer is 4.' is graded wrong against '4')."""
    graded = [c for c in prompts.cases if c.expected is not None]
    exact = [c for c in graded if c.match not in FREE_FORM]
    if not exact:
        return []
    return [f"smoke.prompts: {len(exact)} of {len(graded)} graded prompts of {prompts.path} use match: exact (e.g. "
            f"'{exact[0].id}'), which grades a chat model's free-form answer ('The answer is "
            f"{exact[0].expected}.') as wrong: task accuracy means little unless the model answers with the expected "
            "text alone; use match: word (the expected answer as a whole word or number) or contains"]


def prompt_set_digest(path: Path) -> str:
    """sha256 of the prompt set file's bytes: what the manifest and the MLflow dataset input record."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_prompt_set(path: Path) -> PromptSet:
    """Read a prompt set. Every malformed line is reported with its number, before any model is loaded."""
    if not path.is_file():
        raise InputError(f"smoke.prompts: {path} does not exist; point it at a JSONL prompt set")
    cases: list[PromptCase] = []
    problems: list[str] = []
    ids: set[str] = set()
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            case = PromptCase.model_validate(json.loads(line))
        except json.JSONDecodeError as err:
            problems.append(f"line {n}: not JSON ({err.msg})")
            continue
        except ValidationError as err:
            where, msg = first_problem(err)
            problems.append(f"line {n}: {where + ': ' if where else ''}{msg.removeprefix('Value error, ')}")
            continue
        if case.id in ids:
            problems.append(f"line {n}: duplicate id '{case.id}'")
        ids.add(case.id)
        cases.append(case)
    if problems:
        raise InputError(f"smoke.prompts: {path} is malformed:\n  " + "\n  ".join(problems[:10]))
    if not cases:
        raise InputError(f"smoke.prompts: {path} has no prompts; add at least one JSON line")
    return PromptSet(path=str(path), cases=cases)
