"""The docs a newcomer reads (issue 40): a short README, a docs site that builds with every link and anchor
checked, and reference pages and a JSON Schema generated from the code (scripts/gen_docs.py), never by hand."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from enginefoundry.errors import SpecError
from enginefoundry.spec import load_spec
from enginefoundry.spec.build_spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> Any:
    return generator()


@pytest.fixture(scope="module")
def validator(gen: Any) -> jsonschema.Draft202012Validator:
    schema = gen.spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_generated_reference_and_schema_are_fresh(gen: Any) -> None:
    stale = gen.stale_files()
    assert stale == [], (f"generated from the code, out of date: {[str(p.relative_to(REPO)) for p in stale]}; "
                         f"run `python scripts/gen_docs.py` and commit the result")


def test_spec_reference_lists_every_field_of_every_model(gen: Any) -> None:
    """Each field of each object the schema describes has a row, with its default and bounds where it has them."""
    from enginefoundry.spec.build_spec import BuildSpec

    page = gen.spec_reference()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))
    top = sections["top level"]
    for name in BuildSpec.model_fields:
        assert (f"| `{name}` |" in top) == (name not in gen.INTERNAL_FIELDS), name
    profiles = sections["`profiles[]`"]
    row = next(line for line in profiles.splitlines() if line.startswith("| `max_batch_size` |"))
    assert "`64`" in row and "≥ 1, ≤ 4096" in row and "(llama-3-70b-tp2-a100.yaml)" in row
    for lane in ("reference", "trtllm", "trtllm-engine"):
        assert f"`lane_options ({lane})`" in sections


def test_shipped_specs_name_the_schema_and_satisfy_it(validator: jsonschema.Draft202012Validator, gen: Any) -> None:
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert len(configs) >= 5
    for path in configs:
        text = path.read_text()
        assert text.splitlines()[0] == gen.SCHEMA_COMMENT, f"{path.name}: first line must name the schema"
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(yaml.safe_load(text))]
        assert errors == [], f"{path.name}: {errors}"
    load_spec(REPO / "configs" / "tiny-cpu.yaml")  # the loader reads past the comment line


def _tiny() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    return spec


@pytest.mark.parametrize("change, field", [
    (lambda s: s["variants"][0].update(precison="bf16"), "variants.0"),  # a typo'd key
    (lambda s: s["profiles"][0].update(max_batch_size=0), "profiles.0.max_batch_size"),  # out of bounds
    (lambda s: s["targets"][0].update(arch="sm99"), "targets.0.arch"),  # not an architecture
    (lambda s: s.update(lane_options={"cuda_graphs": True}), "lane_options"),  # trtllm's option, reference lane
    (lambda s: s.update(lane="trtllm", lane_options={"smoke_server": "scoring"}), "lane_options"),  # the reverse
    (lambda s: s.update(lane="tensorrt"), "lane"),  # no such lane
])
def test_the_schema_refuses_what_the_models_refuse(validator: jsonschema.Draft202012Validator, change: Any,
                                                   field: str) -> None:
    spec = _tiny()
    change(spec)
    assert list(validator.iter_errors(spec)), f"the schema accepts a spec the models refuse ({field})"
    with pytest.raises(SpecError) as refused:
        parse_spec(copy.deepcopy(spec))
    assert any(f.startswith(field) for f, _ in refused.value.problems), refused.value.problems


def test_the_schema_accepts_each_lanes_own_options(validator: jsonschema.Draft202012Validator) -> None:
    spec = _tiny()
    spec["lane_options"] = {"smoke_server": "transformers"}
    assert list(validator.iter_errors(spec)) == []
    spec.update(lane="trtllm", lane_options={"cuda_graphs": False})
    assert list(validator.iter_errors(spec)) == []


def test_cli_reference_has_every_command_and_option(gen: Any) -> None:
    from enginefoundry.cli import build_parser

    page = gen.cli_reference()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in command._actions:
            if action.help == argparse.SUPPRESS or action.dest in ("help", "verbose", "json"):
                continue
            shown = f"`{action.option_strings[0]}`" if action.option_strings else f"`{action.metavar or action.dest}`"
            assert shown in section, f"{name}: {shown} missing from docs/reference/cli.md"


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    """.ci/run runs the README's test command (`make test`); the README links to pages that exist."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to no docs page"
    missing = [link for link in local if not (REPO / link).exists()]
    assert missing == [], f"README links to missing files: {missing}"


def test_docs_site_builds_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MkDocs builds docs/ with --strict: a link to a missing page or anchor, or a page left out of the nav, fails."""
    try:
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
    except ImportError:  # never skipped: CI builds the site
        pytest.fail("MkDocs is not installed: pip install -e '.[docs]' (make installs the docs extra)")

    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(config)
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()


def test_every_document_of_the_schemas_package_has_its_schema_file(gen: Any, tmp_path: Path, monkeypatch) -> None:
    """Discovery: every `Document` with a SCHEMA_NAME in a module of enginefoundry/schemas (one another engineer
    adds too) gets `<SCHEMA_NAME>.schema.json` beside it; a missing one is named, and so is one no document makes."""
    import pkgutil

    import enginefoundry.schemas as package
    from enginefoundry.schemas.base import Document

    documents = gen.documents()
    assert {"manifest", "checkpoint-manifest", "pointer", "lease", "verification", "toolchain-channel",
            "unit-outcome"} <= set(documents)
    assert all(issubclass(cls, Document) and cls.__module__.startswith("enginefoundry.schemas.")
               for cls in documents.values())
    modules = {f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)}
    assert {cls.__module__ for cls in documents.values()} <= modules
    for name in documents:
        committed = REPO / "enginefoundry" / "schemas" / f"{name}.schema.json"
        assert committed.is_file(), f"{committed.name} missing: run `python scripts/gen_docs.py`"

    elsewhere = tmp_path / "schemas"
    elsewhere.mkdir()
    (elsewhere / "gone.schema.json").write_text("{}\n")
    monkeypatch.setattr(gen, "SCHEMA_PATH", elsewhere / "spec.schema.json")
    stale = {p.name for p in gen.stale_files()}
    assert {f"{name}.schema.json" for name in documents} | {"gone.schema.json"} <= stale
