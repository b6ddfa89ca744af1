"""`dict[str, Any]` only at a JSON edge, marked: a loose payload inside the domain is a missing model (issue 20).

Every `dict[str, Any]` in enginefoundry/, flows/ and tasks/ carries `# JSON edge: <what JSON it is>` on its line or
the line right above; anything else is typed (a pydantic model, a TypedDict, a frozen dataclass)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "enginefoundry", REPO / "flows", REPO / "tasks"]


def unmarked() -> list[str]:
    found = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            if root.name == "enginefoundry" and path.relative_to(root).parts[0] in ("flows", "tasks"):
                continue  # links to the top-level folders, checked there
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if "dict[str, Any]" not in line:
                    continue
                if "JSON edge" in line or (i > 0 and "JSON edge" in lines[i - 1]):
                    continue
                found.append(f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}")
    return found


def test_every_loose_dict_is_a_marked_json_edge() -> None:
    assert unmarked() == []
