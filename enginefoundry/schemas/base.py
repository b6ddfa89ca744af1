"""What every typed document shares: a schema name and version, a generated JSON Schema, and bounded parsing.

Hostile bytes (a manifest from a store others write, a lease, a channel file) are parsed by `parse_json` within
bounds (size, nesting depth, digits of a number) before pydantic sees them, so no `RecursionError` or stray
`ValueError` reaches a user: every refusal is a `DocumentError` that names the document and what was over.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)

MAX_DEPTH = 32
"""Nesting depth of arrays and objects; every document here is at most ~6 deep."""

MAX_NUMBER_DIGITS = 40
"""Digits of one JSON number (an int or the mantissa of a float); Python's own limit is 4,300 and slow to reach."""


class DocumentError(ValueError):
    """A document that is not what it says: too large, too deep, not JSON, or not valid against its model."""


def _depth_over(text: str, limit: int) -> bool:
    """True when arrays/objects nest deeper than `limit` (a linear scan that skips strings; no recursion)."""
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _bounded_number(what: str, kind: type[int] | type[float]) -> Any:
    def parse(token: str) -> int | float:
        digits = sum(c.isdigit() for c in token.split("e")[0].split("E")[0])
        if digits > MAX_NUMBER_DIGITS:
            raise DocumentError(f"{what}: a number of {digits} digits (at most {MAX_NUMBER_DIGITS})")
        return kind(token)

    return parse


def _no_constant(what: str) -> Any:
    def refuse(token: str) -> float:
        raise DocumentError(f"{what}: {token} is not JSON")

    return refuse


def parse_json(raw: bytes | str, *, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:  # JSON edge
    """Parse untrusted JSON within bounds; raises `DocumentError` naming `what` (never RecursionError)."""
    size = len(raw)
    if size > max_bytes:
        raise DocumentError(f"{what}: {size} bytes (at most {max_bytes})")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as err:
        raise DocumentError(f"{what}: not UTF-8 ({err.reason} at byte {err.start})") from None
    if _depth_over(text, max_depth):
        raise DocumentError(f"{what}: nested deeper than {max_depth}")
    try:
        return json.loads(text, parse_int=_bounded_number(what, int), parse_float=_bounded_number(what, float),
                          parse_constant=_no_constant(what))
    except json.JSONDecodeError as err:
        raise DocumentError(f"{what}: not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:  # unreachable after the depth scan; kept so no caller ever sees one
        raise DocumentError(f"{what}: nested too deep") from None


class Document(BaseModel):
    """A document enginefoundry persists or exchanges.

    A subclass sets `SCHEMA_NAME` (the file stem of its generated JSON Schema, `<name>.schema.json` in this folder)
    and `SCHEMA_VERSION`; `scripts/gen_docs.py` writes the schema and tests/unit/test_docs.py keeps it current.
    """

    SCHEMA_NAME: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    MAX_BYTES: ClassVar[int] = 1 << 20

    @classmethod
    def parse(cls, raw: bytes | str, *, what: str | None = None) -> Self:
        """Parse and validate hostile bytes; every refusal is a `DocumentError` that names the document."""
        name = what or cls.SCHEMA_NAME or cls.__name__
        data = parse_json(raw, what=name, max_bytes=cls.MAX_BYTES)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise DocumentError(f"{name}: {where}: {first['msg']} ({err.error_count()} error(s))") from None

    @classmethod
    def json_schema(cls) -> dict[str, Any]:  # JSON edge: a JSON Schema document (draft 2020-12)
        """The document's JSON Schema as `scripts/gen_docs.py` writes it to `<SCHEMA_NAME>.schema.json`."""
        schema = cls.model_json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://enginefoundry.dev/schemas/{cls.SCHEMA_NAME}-v{cls.SCHEMA_VERSION}.json"
        schema["description"] = " ".join((cls.__doc__ or cls.__name__).split())
        return schema


class WirePart(BaseModel):
    """A part of a published document (a manifest's source, smoke summary, …): typed fields, written back exactly
    as it was read.

    A part's bytes are signed and hashed, and parts written by older or newer releases hold keys this one does not
    know, lack keys it has, and order them as their writer did. So a part keeps the keys it was given, in the
    order given (unknown ones too: `extra="allow"`), and writes only those: a field left at its default is not
    written. Numbers that can be either are `Number`, so an int stays an int."""

    model_config = ConfigDict(extra="allow")

    _wire_order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:  # JSON edge: as read
        part = handler(data)
        if isinstance(data, dict) and isinstance(part, WirePart):
            part._wire_order = tuple(str(k) for k in data)
        return part

    def __eq__(self, other: object) -> bool:
        """Equal when written alike (the order keys were given in is not content); a part also equals the JSON
        object it is written as."""
        if isinstance(other, Mapping):
            return bool(self.model_dump(mode="json") == dict(other))
        if not isinstance(other, WirePart):
            return NotImplemented
        return type(self) is type(other) and self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        """False when the part writes nothing (the empty JSON object `{}`), as the dict it was read from."""
        return bool(self.model_dump())

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:  # JSON edge: as written
        data: dict[str, Any] = handler(self)  # JSON edge: the part's JSON form
        given = set(self.model_fields_set) | set(self.model_extra or {})
        order = [*self._wire_order, *(k for k in data if k not in self._wire_order)]
        return {k: data[k] for k in order if k in given and k in data}


Number: TypeAlias = int | float
"""A JSON number as its writer wrote it: `1` stays `1` and `1.0` stays `1.0` (the bytes are signed)."""
