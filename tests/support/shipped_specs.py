"""The two shipped cpu specs as the alias-lineage tests read them: tiny-cpu as it is, tiny-search with its search
decided (materialised), optionally registered into another model or tracked elsewhere."""

from __future__ import annotations

import yaml

from enginefoundry.search.plan import materialise
from enginefoundry.spec import BuildSpec, load_spec, parse_spec
from tests.support.paths import CONFIGS


def tiny_cpu() -> BuildSpec:
    return load_spec(CONFIGS / "tiny-cpu.yaml")


def tiny_search(registered_model: str | None = None, mlflow: str | None = None) -> BuildSpec:
    data = yaml.safe_load((CONFIGS / "tiny-search.yaml").read_text())
    if registered_model is not None:
        data["tracking"]["registered_model"] = registered_model
    if mlflow is not None:
        data["tracking"]["mlflow_uri"] = mlflow
    spec, _ = materialise(parse_spec(data, base_dir=CONFIGS), progress=lambda _: None)
    return spec
