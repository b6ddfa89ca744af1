"""`lineage`: what produced this artifact? Answered from MLflow and the manifest alone.

A reference is a store URI (of the manifest or its folder), a unit key, or `models:/name@alias`
(or `models:/name/version`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from enginefoundry import tracking_tags as mltags
from enginefoundry.catalog.schemes import is_store_uri
from enginefoundry.errors import InputError, StoreError
from enginefoundry.records.tracking import RetryingClient, mlflow_client
from enginefoundry.schemas.base import WirePart
from enginefoundry.schemas.loose import JsonObject
from enginefoundry.schemas.manifest import Manifest, SearchPart, SourcePart
from enginefoundry.store.layout import BUILD_URI_SHAPE, store_of_build_uri

_KEY = re.compile(r"^[0-9a-f]{12,64}$")


def read_manifest_uri(uri: str, anchor: tuple[str, str] | None = None) -> Manifest:
    """The unit manifest of a store URI: a build's manifest, a key folder (its current build), or a version 1
    `…/artifacts/<model>/<key>[/manifest.json]`. StoreError when its bytes differ from a digest recorded for it
    (the key's pointer history; `anchor`: (where, sha256) from the reference it came from)."""
    from enginefoundry.store.publish import anchor_problems
    from enginefoundry.store.verify import open_build

    store, build = open_build(uri, anchor=anchor)
    changed = [p.line() for p in anchor_problems(store, build) if p.expected]
    if changed:
        raise StoreError(f"{uri} is not the manifest that was published: {'; '.join(changed)}")
    if build.manifest is None:
        raise InputError(f"{uri} is a converted checkpoint, not a unit")
    return build.manifest


def _client(mlflow_uri: str) -> RetryingClient:
    return mlflow_client(mlflow_uri)


def resolve(ref: str, mlflow_uri: str) -> tuple[Manifest, str, dict[str, Any]]:  # JSON edge: lineage JSON
    """(manifest, manifest URI, registry facts) for any kind of reference."""
    registry: dict[str, Any] = {}  # JSON edge: MLflow registry facts, in the lineage JSON output
    if ref.startswith("models:/"):
        from mlflow.exceptions import MlflowException

        body = ref.removeprefix("models:/")
        try:
            if "@" in body:
                name, alias = body.split("@", 1)
                version = _client(mlflow_uri).get_model_version_by_alias(name, alias)
                registry["alias"] = alias
            else:
                name, number = body.rsplit("/", 1)
                version = _client(mlflow_uri).get_model_version(name, number)
        except (MlflowException, ValueError) as err:
            raise InputError(f"{ref}: not found in the MLflow registry at {mlflow_uri} ({str(err)[:150]})") from None
        registry.update({"registered_model": name, "version": version.version, "source": version.source,
                         "manifest_sha256": version.tags.get(mltags.MANIFEST_SHA256, "")})
        uri = version.tags.get(mltags.MANIFEST_URI) or version.source.rstrip("/")
        return read_manifest_uri(uri, registry_anchor(registry)), uri, registry
    if is_store_uri(ref):  # a scheme of the catalog (enginefoundry/catalog/schemes.py)
        return read_manifest_uri(ref), ref, registry
    if _KEY.match(ref):
        runs = _client(mlflow_uri).search_runs(
            experiment_ids=[e.experiment_id for e in _client(mlflow_uri).search_experiments()],
            filter_string=f"tags.`{mltags.CACHE_HIT}` = 'false'", max_results=5000,
        )
        # Builds of one key (a `--force` makes another) are one unit: keyed by the full key, each with its builds.
        units: dict[str, set[str]] = {}
        for r in runs:
            key, uri = r.data.tags.get(mltags.KEY, ""), r.data.tags.get(mltags.MANIFEST_URI)
            if key.startswith(ref) and uri:
                units.setdefault(key, set()).add(uri)
        if not units:
            raise InputError(f"no published unit with key {ref} in MLflow at {mlflow_uri}")
        if len(units) > 1:
            raise InputError(f"key prefix {ref} is ambiguous ({len(units)} units); give more characters")
        builds = sorted(units.popitem()[1])
        stores = sorted({store_of_build_uri(b) for b in builds})
        if len(stores) > 1:  # one key published to several stores that share this MLflow: never guess which
            raise InputError(f"key {ref} is published in {len(stores)} stores ({', '.join(stores)}); give the "
                             f"build's store URI ({BUILD_URI_SHAPE}) or a models:/ reference")
        registry["builds"] = builds
        uri = builds[-1] if len(builds) == 1 else _current_of(builds)
        return read_manifest_uri(uri), uri, registry
    raise InputError(f"'{ref}' is not a store URI, a unit key or models:/name@alias")


def registry_anchor(registry: dict[str, Any]) -> tuple[str, str]:  # JSON edge: MLflow registry facts
    """(where, sha256) of the manifest digest a registry version recorded ("" when it predates the tag)."""
    return (f"models:/{registry['registered_model']}/{registry['version']}", registry.get("manifest_sha256", ""))


def _current_of(builds: list[str]) -> str:
    """The key's current build (its pointer) among several build URIs of one key; the latest when the pointer
    cannot be read. Build ids sort by time."""
    from enginefoundry.store.verify import open_build

    folder = builds[-1].rsplit("/", 1)[0]
    try:
        return open_build(folder)[1].uri
    except Exception:  # the store is unreachable or the pointer refused: the newest build MLflow knows
        return builds[-1]


def _last_verified(uri: str) -> dict[str, Any]:  # JSON edge: a verification record, in the lineage JSON output
    """When `enginefoundry verify` last checked this build, and its verdict (empty when never)."""
    from enginefoundry.store.verify import last_verified, open_build

    try:
        store, build = open_build(uri)
        record = last_verified(store, build)
    except Exception as err:  # the store is unreachable: lineage still answers from the manifest
        return {"note": f"cannot read verification records ({type(err).__name__})"}
    return record.model_dump() if record else {}


def _signature(uri: str, trusted_keys: list[str] | None = None,
               trust_policy: str | None = None) -> dict[str, Any]:  # JSON edge: an attestation verdict (lineage JSON)
    """Who signed this build and whether its attestations verify (against `trusted_keys`/`trust_policy`, the
    `lineage --trusted-key/--trust-policy` its own advice names, plus $ENGINEFOUNDRY_TRUST_POLICY /
    $ENGINEFOUNDRY_TRUSTED_KEYS when set)."""
    from enginefoundry.evidence.attest import verify_attestations
    from enginefoundry.evidence.signing import consumer_policy
    from enginefoundry.store.verify import open_build

    try:
        policy = consumer_policy(trusted_keys, trust_policy)
    except InputError as err:  # the user's trust settings, not the store: say which and how to fix them
        return {"state": "unknown", "line": f"not checked: {err}"}
    try:
        store, build = open_build(uri)
        verdict = verify_attestations(store, build, policy)
    except Exception as err:  # the store is unreachable: lineage still answers from the manifest
        return {"state": "unknown", "line": f"cannot read attestations ({type(err).__name__})"}
    return {**verdict.model_dump(mode="json"), "line": verdict.line()}


def lineage(ref: str, mlflow_uri: str, trusted_keys: list[str] | None = None,
            trust_policy: str | None = None) -> dict[str, Any]:  # JSON edge: the `lineage --json` document
    manifest, uri, registry = resolve(ref, mlflow_uri)
    runs: dict[str, Any] = {}  # JSON edge: MLflow run facts, in the lineage JSON output
    if manifest.mlflow_run_id:
        try:
            client = _client(mlflow_uri)
            run = client.get_run(manifest.mlflow_run_id)
            parent_id = run.data.tags.get("mlflow.parentRunId")
            parent = client.get_run(parent_id) if parent_id else None
            runs = {
                "unit_run_id": run.info.run_id, "unit_run_name": run.info.run_name,
                "experiment_id": run.info.experiment_id, "parent_run_id": parent_id,
                "git_commit": run.data.tags.get(mltags.GIT_COMMIT),
                "prefect_flow_run_id": run.data.tags.get(mltags.PREFECT_FLOW_RUN_ID) or manifest.prefect_flow_run_id,
                "prefect_flow_run_url": run.data.tags.get(mltags.PREFECT_FLOW_RUN_URL),
                "parent_prefect_flow_run_url": parent.data.tags.get(mltags.PREFECT_FLOW_RUN_URL) if parent else None,
            }
        except Exception as err:  # MLflow unreachable: the manifest alone still answers
            runs = {"unit_run_id": manifest.mlflow_run_id, "note": f"MLflow not reachable ({type(err).__name__})"}
    src, bench = manifest.source, _json(manifest.benchmark) or {}
    return {
        "verification": _last_verified(uri),
        "signature": _signature(uri, trusted_keys, trust_policy),
        "artifact": {"manifest_uri": uri, "key": manifest.key, "unit": manifest.unit, "status": manifest.status,
                     "status_reason": manifest.status_reason, "created_at": manifest.created_at,
                     "files": len(manifest.files), "bytes": sum(f.size for f in manifest.files)},
        "source": {"uri": src.uri, "commit_sha": src.revision, "requested_revision": src.requested_revision,
                   "weights_digest": src.weights_digest, "tokenizer_digest": src.tokenizer_digest,
                   "identity": _json(src.identity)},
        "adapter": adapter_of(src),
        "served_adapters": ([a.model_dump(mode="json") for a in served]  # JSON: `lineage` prints and emits it
                            if (served := served_adapters_of(src)) is not None else None),
        "converted_checkpoint": {"key": manifest.checkpoint_key, "uri": manifest.checkpoint_uri},
        "lane": manifest.lane, "versions": manifest.versions,
        "target": _json(manifest.target), "built_on": _json(manifest.device),
        "build": {"variant": _json(manifest.variant), "profile": _json(manifest.profile),
                  "params": _json(manifest.build_params)},
        "smoke": _json(manifest.smoke),
        "benchmark": {k: v for k, v in bench.items() if k not in ("points", "search")},
        "serving_cost": serving_cost(manifest.benchmark.search),
        "search": bench.get("search"),
        "benchmark_points": bench.get("points", []),
        "builds": registry.pop("builds", [uri]),
        "mlflow": {**runs, **({"registry": registry} if registry else {})},
    }


def adapter_of(source: SourcePart) -> JsonObject | None:  # JSON edge: the lineage document's part
    """A unit's adapter lineage from its manifest's source (build.adapters.adapter_lineage), with the base's own
    weights digest; None for a unit of the base alone."""
    identity = source.identity
    if identity is None or identity.adapter is None:
        return None
    return {**identity.adapter.model_dump(mode="json"), "base_weights_digest": identity.base_weights_digest}


def served_adapters_of(source: SourcePart) -> list[SourcePart] | None:
    """The adapters a unit serves beside its base (adapter_mode serve; build.adapters.served_source), each as
    adapter_lineage records it; None for any other unit."""
    identity = source.identity
    return list(identity.adapters) if identity is not None and identity.adapters is not None else None


def adapter_tags(source: SourcePart | Mapping[str, object]) -> dict[str, str]:
    """The MLflow tags of a unit's adapter lineage (runs and registered versions); none for the base alone. A unit
    serving a set of adapters: each tag lists every adapter's value, comma-separated, in the spec's order.
    `source`: a manifest's, or a snapshot's JSON form (read as a manifest's)."""
    part = source if isinstance(source, SourcePart) else SourcePart.model_validate(source)
    served = served_adapters_of(part)
    if served is not None:
        def joined(field: str) -> str:
            return ",".join(str(getattr(a, field) or "") for a in served)[:5000]  # MLflow's tag value limit
        return {mltags.ADAPTER: joined("name"), mltags.ADAPTER_URI: joined("uri"),
                mltags.ADAPTER_REVISION: joined("revision"), mltags.ADAPTER_DIGEST: joined("weights_digest")}
    identity = part.identity
    if identity is None or identity.adapter is None:
        return {}
    adapter = identity.adapter
    return {mltags.ADAPTER: adapter.name or "", mltags.ADAPTER_URI: adapter.uri,
            mltags.ADAPTER_REVISION: adapter.revision or "", mltags.ADAPTER_DIGEST: adapter.weights_digest,
            mltags.BASE_WEIGHTS_DIGEST: identity.base_weights_digest or ""}


def serving_cost(search: SearchPart | None) -> JsonObject | None:  # JSON edge: the lineage document's part
    """Cost and energy at the SLO point, from a searched unit's verification (None for a unit never searched)."""
    if search is None:
        return None
    cost = search.cost
    return {"goodput_concurrency": search.goodput_concurrency, "usd_per_mtok": cost.usd_per_mtok,
            "usd_per_hour": cost.usd_per_hour, "price_source": cost.price_source,
            "tokens_per_joule": cost.tokens_per_joule if "tokens_per_joule" in cost.model_fields_set
            else "unavailable",
            "avg_watts_per_gpu": cost.avg_watts_per_gpu if "avg_watts_per_gpu" in cost.model_fields_set
            else "unavailable",
            "prediction_error": search.prediction_error, "flagged": search.flagged}


def _json(part: WirePart | None) -> JsonObject | None:  # JSON edge: a manifest part as published
    return part.model_dump(mode="json") if part is not None else None
