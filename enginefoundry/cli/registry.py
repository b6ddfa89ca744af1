"""Commands over published units and the MLflow registry: lineage, promote, rollback.

The MLflow URI: --mlflow-uri, else $MLFLOW_TRACKING_URI, else the default local database (enginefoundry.settings).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from enginefoundry.cli.common import DEFAULT_MLFLOW, emit_json, mlflow_uri_of, wants_json
from enginefoundry.cli.signing import SignatureRefused, policy_of, trust_options
from enginefoundry.console import console, table
from enginefoundry.errors import EXIT_OK, InputError

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

MLFLOW_HELP = f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else {DEFAULT_MLFLOW})"
STEM_HELP = ("alias stem: the target name, or <target>-<variant>-<profile> when the spec has several units for "
             "that target (the aliases are <stem>-candidate and <stem>-champion)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lin = sub.add_parser("lineage", help="what produced an artifact: store URI, unit key or models:/name@alias")
    lin.add_argument("ref")
    lin.add_argument("--mlflow-uri", help=MLFLOW_HELP)
    lin.add_argument("--trusted-key", action="append", metavar="PUB", default=None,
                     help="a public key whose signatures are accepted, for the signature row (repeatable)")
    lin.add_argument("--trust-policy", metavar="FILE", help="trust policy file, for the signature row")
    lin.set_defaults(handler=cmd_lineage)

    for name, what in (("promote", "move <stem>-champion to a version (default: the <stem>-candidate version)"),
                       ("rollback", "put the previous <stem>-champion back")):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("registered_model", help="MLflow registered model, e.g. tiny-chat")
        cmd.add_argument("--target", required=True, metavar="STEM", help=STEM_HELP)
        if name == "promote":
            cmd.add_argument("--version", help="registered model version (default: the <stem>-candidate alias)")
        # Promotion and rollback put a build into service: the same signature policy holds for both.
        cmd.add_argument("--spec", help="build spec whose signature policy (publish.require_signature, "
                                        "trusted_keys, trust_policy) applies besides the trust options")
        trust_options(cmd)
        cmd.add_argument("--mlflow-uri", help=MLFLOW_HELP)
        cmd.set_defaults(handler=cmd_registry)


def _adapter_line(adapter: dict[str, Any]) -> str:  # JSON edge: a lineage's adapter entry
    """`name: uri @ revision, digest <12>`: one adapter of a unit's lineage, as `lineage` prints it."""
    revision = f" @ {adapter['revision']}" if adapter.get("revision") else ""
    return f"{adapter.get('name')}: {adapter.get('uri')}{revision}, digest {str(adapter.get('weights_digest'))[:12]}"


def cmd_lineage(args: argparse.Namespace) -> int:
    from enginefoundry.records.lineage import lineage

    mlflow_uri = mlflow_uri_of(args)
    chain = lineage(args.ref, mlflow_uri, args.trusted_key, args.trust_policy)
    if wants_json(args):
        emit_json(chain)
        return EXIT_OK
    a, src, ck, ml = chain["artifact"], chain["source"], chain["converted_checkpoint"], chain["mlflow"]
    rows = [
        ("artifact", f"{a['unit']} [{a['status']}] {a['files']} files, {a['bytes'] / 2**20:.1f} MiB"),
        ("manifest", a["manifest_uri"]), ("key", a["key"]),
        ("source", f"{src['uri']}" + (f" @ {src['commit_sha']}" if src.get("commit_sha") else "")),
        ("weights digest", src["weights_digest"]), ("tokenizer digest", src["tokenizer_digest"]),
        ("converted checkpoint", f"{ck['key']} {ck['uri'] or ''}"),
        ("lane / versions", f"{chain['lane']} " + ", ".join(f"{k} {v}" for k, v in chain["versions"].items())),
        ("built on", ", ".join(f"{k}={v}" for k, v in chain["built_on"].items()
                               if k in ("gpu_name", "arch", "memory_gib", "cpu", "device", "torch", "cuda"))),
        ("build", json.dumps(chain["build"]["params"], sort_keys=True)),
        ("smoke", ", ".join(f"{k.removeprefix('smoke_')}={v}" for k, v in chain["smoke"].items())),
        ("benchmark", ", ".join(f"{k}={v}" for k, v in chain["benchmark"].items() if not isinstance(v, list))),
        ("MLflow run", f"{ml.get('unit_run_id')} (parent {ml.get('parent_run_id')}) in {mlflow_uri}"),
        ("Prefect flow run", f"{ml.get('prefect_flow_run_id') or '-'} {ml.get('prefect_flow_run_url') or ''}"),
        ("project commit", str(ml.get("git_commit"))),
        ("last verified", _verified_line(chain.get("verification") or {})),
        ("signature", (chain.get("signature") or {}).get("line", "unknown")),
    ]
    adapter, served = chain.get("adapter"), chain.get("served_adapters")
    if adapter:  # a merged adapter's unit (model.adapters, adapter_mode merge)
        rows.insert(4, ("adapter", _adapter_line(adapter)))
    for i, one in enumerate(served or []):  # a unit serving the base and every adapter (adapter_mode serve)
        rows.insert(4 + i, ("served adapter", _adapter_line(one)))
    if chain.get("serving_cost"):
        rows.append(("cost at the SLO", ", ".join(f"{k}={v}" for k, v in chain["serving_cost"].items()
                                                   if v is not None)))
    if len(chain["builds"]) > 1:
        rows.append(("builds of this key", "\n".join(chain["builds"])))
    if ml.get("registry"):
        reg = ml["registry"]
        rows.append(("registry", f"{reg['registered_model']} v{reg['version']}"
                     + (f" @{reg['alias']}" if reg.get("alias") else "")))
    table("lineage", [{"": k, "value": v} for k, v in rows])
    return EXIT_OK


def _verified_line(rec: dict[str, Any]) -> str:  # JSON edge: the store's verification record
    if not rec:
        return "never (enginefoundry verify REF)"
    if "verified_at" not in rec:
        return str(rec.get("note", "unknown"))
    verdict = "ok" if rec["ok"] else f"FAILED ({len(rec.get('problems', []))} problem(s))"
    return f"{rec['verified_at']}: {verdict}, {rec['files']} files"


def cmd_registry(args: argparse.Namespace) -> int:
    from enginefoundry.records.promotion import Registry, candidate_alias

    registry = Registry(mlflow_uri_of(args))
    model, stem = args.registered_model, args.target
    if args.command == "rollback":
        move = registry.rollback(model, stem, check=lambda version: _signature_gate(args, version, "rollback"))
    else:
        number = args.version
        if number is None:
            candidate = registry.version_by_alias(model, candidate_alias(stem))
            if candidate is None:
                known = registry.aliases(model)
                raise InputError(f"{model} has no alias {candidate_alias(stem)}: give --version N, or a stem of "
                                 f"its aliases ({', '.join(known) or 'none'})")
            number = candidate.version
        checked = _signature_gate(args, registry.version(model, str(number)))
        move = registry.promote(model, stem, number, "promoted by hand (enginefoundry promote)")
        if not wants_json(args):
            console.print(f"signature: {checked}", markup=False, highlight=False, soft_wrap=True)
    from enginefoundry.tasks.events import emit_registry_move

    emit_registry_move(model, stem, move.action, move.champion, move.previous, move.detail, outside_flows=True)
    if wants_json(args):
        emit_json(move)
        return EXIT_OK
    console.print(f"{model}: {move.action}: {move.detail}", markup=False)
    return EXIT_OK


def _signature_gate(args: argparse.Namespace, version: ModelVersion,
                    what: str = "promote") -> str:
    """Refuse (exit 1, naming the cause) a version whose signatures fail, or that is unsigned when signatures
    are required (the trust options, the spec's policy, $ENGINEFOUNDRY_REQUIRE_SIGNATURE). Returns what was checked:
    the build's signature verdict and the policy it was held to."""
    from enginefoundry.evidence.attest import promotion_refusal, verify_attestations
    from enginefoundry.records.promotion import manifest_uri_of
    from enginefoundry.store.verify import open_build

    policy, uri = policy_of(args), manifest_uri_of(version)
    if refusal := promotion_refusal(uri, policy):
        raise SignatureRefused(f"{what} refused: {args.registered_model} v{version.version}: {refusal}")
    held_to = (f"signatures {'required' if policy.require_signature else 'not required'}, "
               f"{len(policy.keys)} trusted key(s)")
    try:
        store, build = open_build(uri)
        return f"{verify_attestations(store, build, policy).line()} ({held_to}; {uri})"
    except Exception as err:  # the store away after the gate passed: say so rather than fail the move
        return f"not re-read ({type(err).__name__}); {held_to}"
