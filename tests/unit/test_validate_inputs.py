"""Issue 34, the inputs `validate` let through: a prices file that is missing, a FIFO or /dev/zero, an empty SKU name,
`.inf` and `true` as prices; a source folder with a symlink out of it (refused by `run`, so by `validate` too);
benchmark settings that cannot run (concurrency 10^9, one request at concurrency 64). Each is refused before any
build, naming the field."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from enginefoundry.bench.costs import price_table
from enginefoundry.errors import SpecError
from enginefoundry.spec import parse_spec
from tests.support.paths import CONFIGS, REPO, TINY_MODEL


def _search_spec(tmp_path: Path, prices: dict):
    data = yaml.safe_load((CONFIGS / "tiny-search.yaml").read_text())
    data["search"]["prices"] = prices
    return parse_spec(data, base_dir=CONFIGS)


def _problems(spec) -> dict[str, str]:
    from enginefoundry.planning.validate import validate_deep

    with pytest.raises(SpecError) as err:
        validate_deep(spec)
    return dict(err.value.problems)


def test_a_missing_prices_file_is_refused_at_validate(tmp_path):
    spec = _search_spec(tmp_path, {"file": str(tmp_path / "absent.yaml")})
    assert "cannot be read" in _problems(spec)["search.prices.file"]


def _refused_without_hanging(spec) -> str:
    """price_table in a daemon thread: a read that hangs (a FIFO nobody writes) fails the test instead of the run."""
    out: list[BaseException | None] = []

    def read() -> None:
        try:
            price_table(spec)
            out.append(None)
        except BaseException as err:
            out.append(err)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert out, "reading the prices file hung"
    assert isinstance(out[0], SpecError), out[0]
    return str(out[0])


def test_a_fifo_dev_zero_or_huge_prices_file_is_refused_not_read_forever(tmp_path):
    fifo = tmp_path / "prices.fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in _refused_without_hanging(_search_spec(tmp_path, {"file": str(fifo)}))
    assert "not a regular file" in _refused_without_hanging(_search_spec(tmp_path, {"file": "/dev/zero"}))
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"h100: 3\n" + b"#" * (2 << 20))
    assert "larger than" in _refused_without_hanging(_search_spec(tmp_path, {"file": str(huge)}))


@pytest.mark.parametrize(("text", "says"), [
    ("'': 3.0\n", "empty"),
    ("'  ': 3.0\n", "empty"),
    ("h100: .inf\n", "not a positive"),
    ("h100: true\n", "not a positive"),
    ("h100: -1\n", "not a positive"),
    ("{}\n", "not a mapping"),
])
def test_a_prices_file_holds_named_skus_and_finite_positive_prices(tmp_path, text, says):
    (tmp_path / "prices.yaml").write_text(text)
    spec = _search_spec(tmp_path, {"file": str(tmp_path / "prices.yaml")})
    assert says in _problems(spec)["search.prices.file"]


@pytest.mark.parametrize("table", [{"": 3.0}, {"h100": float("inf")}, {"h100": True}])
def test_the_specs_own_prices_are_named_and_finite(tmp_path, table):
    with pytest.raises(SpecError) as err:
        _search_spec(tmp_path, {"gpu_hour": table})
    assert "search.prices.gpu_hour" in str(err.value)


def test_validate_refuses_a_source_folder_that_run_refuses(tmp_path):
    """A symlink leading out of the source folder: `run` refused it (SourceError), `validate` said ok."""
    from enginefoundry.planning.validate import validate_file

    source = tmp_path / "model"
    source.mkdir()
    for f in TINY_MODEL.iterdir():
        if f.is_file():
            (source / f.name).write_bytes(f.read_bytes())
    (tmp_path / "outside.txt").write_text("not the model's")
    (source / "notes.txt").symlink_to(tmp_path / "outside.txt")
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["model"]["source"] = str(source)
    data["smoke"]["prompts"] = str(REPO / "configs" / "prompts" / "tiny-chat.jsonl")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        validate_file(path)
    problems = dict(err.value.problems)
    assert "symlinks pointing outside it (notes.txt)" in problems["model.source"], problems


@pytest.mark.parametrize(("bench", "says"), [
    ({"concurrency": [10 ** 9], "request_count": 10 ** 9}, "more connections than one client host"),
    ({"concurrency": [64], "request_count": 1}, "request_count (1) is smaller than the largest concurrency (64)"),
])
def test_benchmark_settings_that_cannot_run_are_refused(bench, says):
    data = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    data["benchmark"].update(bench)
    with pytest.raises(SpecError) as err:
        parse_spec(data, base_dir=CONFIGS)
    assert "benchmark" in str(err.value) and says in str(err.value)
    data["benchmark"]["enabled"] = False  # settings that never run are not refused
    if "request_count (1)" in says:
        parse_spec(data, base_dir=CONFIGS)
