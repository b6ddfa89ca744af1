"""`lane_options`: a typed model per lane, chosen by the spec's `lane` (a union discriminated by `lane`, whose
members are the options models registered in enginefoundry.lanes.registry). Unknown keys are refused by pydantic
(extra="forbid"); the lane's model explains the ones it recognises (a removed TensorRT-LLM flag, a spec field)."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, JsonValue, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import ErrorDetails


class LaneOptions(BaseModel):
    """Base of every lane's options model. Reads like a mapping of the options the spec set (not the defaults),
    which is what unit keys and manifests record: adding an option with a default does not change old keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # Options that change how the pipeline judges a build, not what it builds: unit keys leave them out (`keyed`).
    unkeyed: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        """Why `key` is not an option of this lane, when the lane knows better than "unknown key"."""
        return None

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:  # JSON edge: options as written
        # A spec dumps (and round-trips) as written: defaults stay out of keys, manifests and model_dump().
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def given(self) -> dict[str, JsonValue]:
        """The options the spec set, as JSON values."""
        return self.model_dump(mode="json")

    def keyed(self) -> dict[str, JsonValue]:
        """The options the spec set, less the `unkeyed` ones: what a unit's key hashes."""
        return {k: v for k, v in self.given().items() if k not in self.unkeyed}

    def resolved(self) -> dict[str, Any]:  # JSON edge: every option by name (resolve_options)
        """Every option, defaults filled in."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    # mapping view of the options the spec set
    def keys(self) -> list[str]:
        return sorted(self.model_fields_set)

    def items(self) -> list[tuple[str, JsonValue]]:
        given = self.given()
        return [(k, given[k]) for k in self.keys()]

    def __getitem__(self, key: str) -> JsonValue:
        if key not in self.model_fields_set:
            raise KeyError(key)
        return self.given()[key]

    def get(self, key: str, default: JsonValue = None) -> JsonValue:
        return self.given().get(key, default)

    def __len__(self) -> int:
        return len(self.model_fields_set)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set

    def iter_keys(self) -> Iterator[str]:
        return iter(self.keys())


class NoOptions(LaneOptions):
    """A lane without options: any key is refused."""

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        return "this lane has no options: remove lane_options"


def option_message(model: type[LaneOptions], err: ErrorDetails, pinned: str | None) -> str:
    """One pydantic error of a lane's options, in words a spec author acts on (loc relative to lane_options)."""
    key = str(err["loc"][0]) if err["loc"] else ""
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        return model.explain_unknown(key, pinned) or "unknown option"
    if kind == "literal_error":
        field = model.model_fields[key]
        choices = [a for arg in typing.get_args(field.annotation)
                   for a in (typing.get_args(arg) or ([] if arg is type(None) else [arg]))]
        return f"must be one of {', '.join(map(str, choices))}; got {value!r}"
    if kind == "bool_type":
        return f"must be true or false, got {value!r}"
    if kind == "int_type":
        return f"must be an integer, got {value!r}"
    if kind == "string_type":
        return f"must be a string, got {value!r}"
    if kind == "greater_than_equal":
        return f"must be ≥ {err['ctx']['ge']}, got {value}"
    return err["msg"].removeprefix("Value error, ")

