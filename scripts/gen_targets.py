#!/usr/bin/env python3
"""Generate every file that lists GPU pools from the one table, enginefoundry/catalog/gpu_targets.py:

    python scripts/gen_targets.py          # rewrite them
    python scripts/gen_targets.py --check  # exit 1 naming each file that is out of date

* deployment.yaml: the `build-unit/<pool>` deployments (between the generated-block markers);
* Makefile: `POOLS := …` (between the markers);
* k8s/base-job-template-<pool>.json: Prefect's public default for the `kubernetes` worker type
  (`KubernetesWorker.get_default_base_job_template()` of prefect-kubernetes, the same template
  `prefect work-pool get-default-base-job-template --type kubernetes` prints) plus the GPU parts;
* k8s/helm/values-<pool>.yaml: values for one `prefect-worker` Helm release per GPU pool.

Needs prefect-kubernetes (the `test` extra installs it). tests/unit/test_gpu_targets.py runs `--check`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from enginefoundry.catalog import gpu_targets as gt  # noqa: E402


def prefect_kubernetes_default() -> dict[str, Any]:
    """The base job template a `kubernetes` work pool gets by default, from prefect-kubernetes' public API."""
    from prefect_kubernetes.worker import KubernetesWorker

    return KubernetesWorker.get_default_base_job_template()


def expected_files(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file → its content as the table says it should be."""
    default = prefect_kubernetes_default()
    out: dict[Path, str] = {}
    for name, block in (("deployment.yaml", gt.render_deployments()), ("Makefile", gt.render_makefile_pools())):
        path = root / name
        out[path] = gt.replace_block(path.read_text(), block, name)
    for target in gt.gpu_pools():
        assert target.template_file and target.helm_values_file
        out[root / target.template_file] = gt.render_job_template(target, default)
        out[root / target.helm_values_file] = gt.render_helm_values(target)
    return out


def stale_files(root: Path = ROOT) -> list[Path]:
    """Generated files that differ from the table, plus pool files no row generates any more."""
    expected = expected_files(root)
    stale = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    generated = set(expected)
    on_disk = [*(root / "k8s").glob("base-job-template-*.json"), *(root / "k8s" / "helm").glob("values-*.yaml")]
    leftovers = [p for p in on_disk if p not in generated]
    return stale + sorted(leftovers)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_files()
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date with enginefoundry/catalog/gpu_targets.py: "
                  "run python scripts/gen_targets.py", file=sys.stderr)
        return 1 if stale else 0
    expected = expected_files()
    for path in stale_files():
        if path not in expected:
            path.unlink()
            print(f"removed {path.relative_to(ROOT)}")
    for path, text in expected.items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
