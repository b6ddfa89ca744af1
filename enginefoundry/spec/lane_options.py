"""`lane_options`: a typed model per lane, chosen by the spec's `lane` (a union discriminated by `lane`, whose
members are the options models registered in enginefoundry.lanes.registry). Unknown keys are refused by pydantic
(extra="forbid"); the lane's model explains the ones it recognises (a removed TensorRT-LLM flag, a spec field)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class LaneOptions(BaseModel):
    """Base of every lane's options model. Reads like a mapping of the options the spec set (not the defaults),
    which is what unit keys and manifests record: adding an option with a default does not change old keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        """Why `key` is not an option of this lane, when the lane knows better than "unknown key"."""
        return None

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A spec dumps (and round-trips) as written: defaults stay out of keys, manifests and model_dump().
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def given(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def resolved(self) -> dict[str, Any]:
        """Every option, defaults filled in."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    # mapping view of the options the spec set
    def keys(self) -> list[str]:
        return sorted(self.model_fields_set)

    def items(self) -> list[tuple[str, Any]]:
        given = self.given()
        return [(k, given[k]) for k in self.keys()]

    def __getitem__(self, key: str) -> Any:
        if key not in self.model_fields_set:
            raise KeyError(key)
        return self.given()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.given().get(key, default)

    def __len__(self) -> int:
        return len(self.model_fields_set)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set

    def iter_keys(self) -> Iterator[str]:
        return iter(self.keys())


class NoOptions(LaneOptions):
    """A lane without options: any key is refused."""
