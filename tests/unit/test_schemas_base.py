"""schemas.base: hostile bytes give a DocumentError that names the document and what was over, never a
RecursionError, a stray ValueError or a traceback (issue 35)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from pydantic import Field

from enginefoundry.schemas.base import MAX_DEPTH, MAX_NUMBER_DIGITS, Document, DocumentError, WirePart, parse_json


class Probe(Document):
    SCHEMA_NAME: ClassVar[str] = ""  # a test document: no schema file
    MAX_BYTES: ClassVar[int] = 4096

    name: str
    count: int = Field(ge=0)


def test_bounded_json_parses_what_json_parses() -> None:
    assert parse_json(b'{"a": [1, 2.5, "x", null, true]}', what="doc", max_bytes=100) == {
        "a": [1, 2.5, "x", None, True]}
    assert parse_json('"\\u00e9\\"[{"', what="doc", max_bytes=100) == 'é"[{'  # brackets in strings are not depth


@pytest.mark.parametrize(("raw", "said"), [
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}"),
    (b"[" * 100_000, f"nested deeper than {MAX_DEPTH}"),  # json.loads alone raises RecursionError here
    (b"1" * (MAX_NUMBER_DIGITS + 1), f"a number of {MAX_NUMBER_DIGITS + 1} digits"),
    (b"[1." + b"5" * 100 + b"]", "a number of 101 digits"),
    (b"[NaN]", "NaN is not JSON"),
    (b"[Infinity]", "Infinity is not JSON"),
    (b"[-Infinity]", "-Infinity is not JSON"),
    (b'{"a": "\xff\xfe"}', "not UTF-8"),
    (b'{"a": 1,}', "not JSON"),
    (b"", "not JSON"),
    (b"x" * 200, "200 bytes (at most 100)"),
])
def test_hostile_bytes_are_refused_with_the_document_and_the_bound(raw: bytes, said: str) -> None:
    with pytest.raises(DocumentError, match=r"^doc: ") as err:
        parse_json(raw, what="doc", max_bytes=100 if len(raw) == 200 else 1 << 20)
    assert said in str(err.value)


def test_a_number_within_the_digits_reads_exactly() -> None:
    assert parse_json(b"[" + b"9" * MAX_NUMBER_DIGITS + b", 1e300]", what="doc", max_bytes=1000) == [
        int("9" * MAX_NUMBER_DIGITS), 1e300]


def test_document_parse_names_the_field_and_counts_the_errors() -> None:
    assert Probe.parse(b'{"name": "a", "count": 2}') == Probe(name="a", count=2)
    with pytest.raises(DocumentError, match=r"^probe file: count: Input should be greater than or equal to 0 "
                                            r"\(1 error\(s\)\)$"):
        Probe.parse(b'{"name": "a", "count": -1}', what="probe file")
    with pytest.raises(DocumentError, match=r"^Probe: name: Field required \(2 error\(s\)\)$"):
        Probe.parse(b'{"count": "many"}')
    with pytest.raises(DocumentError, match=r"^Probe: \(top\): Input should be a valid dictionary"):
        Probe.parse(b"[1]")
    with pytest.raises(DocumentError, match="4097 bytes"):
        Probe.parse(json.dumps({"name": "x" * 4090}).encode()[:4097].ljust(4097))


class Part(WirePart):
    a: int | None = None
    b: float | int | None = None


def test_a_part_writes_back_the_keys_it_was_given_in_their_order_and_number_form() -> None:
    given = {"zz": [1], "b": 1, "a": 2}
    part = Part.model_validate(given)
    assert list(part.model_dump()) == ["zz", "b", "a"] and part.model_dump()["b"] == 1
    assert json.dumps(part.model_dump(mode="json")) == json.dumps(given)
    assert Part.model_validate({}).model_dump() == {}  # defaults are not written
    assert part == given and part == Part.model_validate({"a": 2, "b": 1, "zz": [1]})  # order is not content
    assert part.model_copy(update={"a": 3}).model_dump() == {"zz": [1], "b": 1, "a": 3}
