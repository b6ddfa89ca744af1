"""One table of GPU targets (enginefoundry/catalog/gpu_targets.py): every Arch has a row, and every file that lists
pools (deployment.yaml, the Makefile, k8s templates, Helm values) is what scripts/gen_targets.py generates from it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from enginefoundry.catalog import gpu_targets as gt
from enginefoundry.spec import Arch, Target

REPO = Path(__file__).resolve().parents[2]


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_targets", REPO / "scripts" / "gen_targets.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_arch_has_a_row_and_a_pool() -> None:
    assert {a.value for a in Arch} == set(gt.GPU_TARGETS)
    for arch in Arch:
        row = gt.gpu_target(arch.value)
        assert arch.compute_capability == row.compute_capability
        assert Target(name="t", arch=arch).pool == row.pool
        assert row.is_gpu == (arch is not Arch.CPU)
        if row.is_gpu:
            assert row.products, f"{arch} lists no GPU product label"
            assert row.pool == f"gpu-{arch.value}"
    assert len(set(gt.pools())) == len(gt.pools())
    assert {"gpu-sm86", "gpu-sm120"} <= set(gt.pools())


def test_generated_files_match_the_table() -> None:
    pytest.importorskip("prefect_kubernetes", reason="pip install prefect-kubernetes==0.8.0 (the test extra)")
    stale = generator().stale_files()
    assert stale == [], f"run python scripts/gen_targets.py: {[str(p.relative_to(REPO)) for p in stale]}"


def test_deployment_yaml_and_makefile_list_every_pool() -> None:
    deployments = yaml.safe_load((REPO / "deployment.yaml").read_text())["deployments"]
    units = {d["name"]: d for d in deployments if d["entrypoint"] == "flows/build_unit.py:build_unit"}
    assert list(units) == gt.pools()
    assert all(d["work_pool"]["name"] == name for name, d in units.items())
    make_pools = re.search(r"^POOLS := (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert make_pools and make_pools.group(1).split() == gt.pools()
    for row in gt.gpu_pools():
        assert row.template_file and row.helm_values_file
        template = json.loads((REPO / row.template_file).read_text())
        assert template["variables"]["properties"]["gpu_products"]["default"] == list(row.products)
        values = yaml.safe_load((REPO / row.helm_values_file).read_text())
        assert values["worker"]["config"] == {"workPool": row.pool, "type": "kubernetes",
                                              "baseJobTemplate": {"configuration": None}}


def test_a_drifted_file_is_named(tmp_path: Path) -> None:
    pytest.importorskip("prefect_kubernetes", reason="pip install prefect-kubernetes==0.8.0 (the test extra)")
    for name in ("deployment.yaml", "Makefile"):
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "k8s" / "helm").mkdir(parents=True)
    gen = generator()
    for path, text in gen.expected_files(tmp_path).items():
        path.write_text(text)
    assert gen.stale_files(tmp_path) == []
    makefile = tmp_path / "Makefile"
    makefile.write_text(makefile.read_text().replace(" gpu-sm120\n", "\n"))
    (tmp_path / "k8s" / "base-job-template-gpu-sm70.json").write_text("{}")
    assert gen.stale_files(tmp_path) == [makefile, tmp_path / "k8s" / "base-job-template-gpu-sm70.json"]


def test_target_skus_narrow_the_products() -> None:
    sm90 = gt.gpu_target("sm90")
    # substrings, as placement matches the GPU name (enginefoundry.gpu.detect.match_target)
    assert sm90.products_for(["H100"]) == ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL", "NVIDIA-H100-PCIe")
    assert sm90.products_for(["h200 "]) == ("NVIDIA-H200", "NVIDIA-GH200-480GB")
    assert sm90.products_for([]) == sm90.products
    assert sm90.products_for(["no-such-sku"]) == sm90.products  # placement refuses a wrong GPU at run time
    with pytest.raises(KeyError, match=r"gpu_targets\.py"):
        gt.gpu_target("sm70")
