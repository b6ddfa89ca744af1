"""`speculative`: the speculative-decoding section of a spec (one per spec; every unit serves with it).

Only the shape of the section lives here: which algorithm, its draft checkpoint (a source like the base, pinned and
digested like it), the draft length and the algorithm's own knobs. Whether a TensorRT-LLM release, a model family or
a one-/two-model implementation supports it is the lane's to say (enginefoundry/lanes/speculation.py), and whether
the model has MTP layers or the draft shares the target's vocabulary is read from the checkpoints' config.json.

Speculation must not change greedy answers: the smoke gate compares each speculative unit with its non-speculative
twin (the same unit with this section removed), and the benchmark reports acceptance rate and speed-up against it.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from enginefoundry.spec.source import SourceKind, SourceURI, checked_source_uri, parse_source_uri


class SpecAlgorithm(StrEnum):
    """The speculative-decoding algorithms of TensorRT-LLM's PyTorch backend (its `speculative_config` classes)."""

    DRAFT_TARGET = "draft_target"  # DraftTargetDecodingConfig: any smaller model with the target's tokenizer
    EAGLE3 = "eagle3"  # Eagle3DecodingConfig: an EAGLE 3 draft head trained for the target
    MTP = "mtp"  # MTPDecodingConfig: the model's own multi-token-prediction layers (num_nextn_predict_layers)
    NGRAM = "ngram"  # NGramDecodingConfig: prompt lookup, no draft model

    @property
    def needs_draft(self) -> bool:
        return self in (SpecAlgorithm.DRAFT_TARGET, SpecAlgorithm.EAGLE3)


class SpeculativeSpec(BaseModel):
    """How every unit of the spec speculates."""

    model_config = ConfigDict(extra="forbid")

    algorithm: SpecAlgorithm = Field(description="draft_target, eagle3, mtp or ngram")
    draft: str | None = Field(default=None, description="draft checkpoint (draft_target, eagle3): hf://org/name@rev, "
                                                        "s3://bucket/prefix, file:///path or a path; fetched, pinned "
                                                        "and digested like model.source")
    max_draft_len: Annotated[int, Field(ge=1, le=32)] = Field(
        default=3, description="tokens drafted per step (upstream max_draft_len)")
    num_nextn_predict_layers: Annotated[int, Field(ge=1, le=16)] | None = Field(
        default=None, description="mtp: MTP layers to use (default: 1); at most the model's num_nextn_predict_layers")
    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] | None = Field(
        default=None, description="ngram: longest suffix matched against the prompt (upstream default 2)")
    one_model: bool | None = Field(
        default=None, description="eagle3: the one-model implementation (draft as a submodule, upstream "
                                  "eagle3_one_model; default: the release's own default) or the two-model one")

    @field_validator("draft")
    @classmethod
    def _valid_uri(cls, value: str | None) -> str | None:
        return checked_source_uri(value)

    @model_validator(mode="after")
    def _fields_of_the_algorithm(self) -> SpeculativeSpec:
        a = self.algorithm
        if a.needs_draft and self.draft is None:
            raise ValueError(f"algorithm {a.value} needs a draft checkpoint: set speculative.draft to its source "
                             "(hf://org/name@revision, s3://bucket/prefix or a path)")
        if not a.needs_draft and self.draft is not None:
            own = "the model's own MTP layers" if a is SpecAlgorithm.MTP else "n-grams of the prompt"
            raise ValueError(f"algorithm {a.value} drafts with {own}, not a draft checkpoint: remove speculative.draft "
                             "or use algorithm draft_target / eagle3")
        for name, owner in (("num_nextn_predict_layers", SpecAlgorithm.MTP),
                            ("max_matching_ngram_size", SpecAlgorithm.NGRAM),
                            ("one_model", SpecAlgorithm.EAGLE3)):
            if getattr(self, name) is not None and a is not owner:
                raise ValueError(f"{name} belongs to algorithm {owner.value}, not {a.value}: remove it")
        return self

    @property
    def mtp_layers(self) -> int:
        """MTP layers the unit uses (mtp only): the spec's, else 1 (upstream MTPDecodingConfig's default)."""
        return self.num_nextn_predict_layers or 1

    def parsed_draft(self, base_dir: Path | None = None) -> SourceURI | None:
        """The draft's source URI; a relative local path is taken relative to `base_dir` (the spec's folder)."""
        if self.draft is None:
            return None
        src = parse_source_uri(self.draft)
        if src.kind is SourceKind.LOCAL and base_dir is not None and not Path(src.location).is_absolute():
            return SourceURI(kind=SourceKind.LOCAL, location=str((base_dir / src.location).resolve()))
        return src

    def keyed(self) -> dict[str, object]:  # JSON edge: the section as a unit key hashes it
        """The section as a unit key hashes it: the fields set (the draft as its digest joins the key apart)."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"draft"})


__all__ = ["SpecAlgorithm", "SpeculativeSpec"]
