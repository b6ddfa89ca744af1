"""Signing: `keygen`, and the trust options (--trusted-key, --trust-policy, --require-signature) that verify,
pull, promote and rollout share."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from enginefoundry.cli.common import emit_json, wants_json
from enginefoundry.console import console
from enginefoundry.errors import EXIT_OK, InputError, PipelineError
from enginefoundry.evidence.signing import (
    ENV_KEY_FILE,
    ENV_REQUIRE_SIGNATURE,
    ENV_TRUST_POLICY,
    ENV_TRUSTED_KEYS,
    consumer_policy,
    key_id,
    keygen,
    merged_policy,
    signer_from_env,
    spec_policy,
)

if TYPE_CHECKING:  # imported when a command runs: `enginefoundry --help` stays fast
    from enginefoundry.evidence.attest import SignatureVerdict
    from enginefoundry.evidence.signing import TrustPolicy
    from enginefoundry.spec import BuildSpec
    from enginefoundry.store.backends import Store
    from enginefoundry.store.publish import PublishedBuild


class SignatureRefused(PipelineError):
    """A build whose signatures are required and do not verify (exit 1)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kg = sub.add_parser("keygen", help="make an ECDSA P-256 signing key pair: <out>.key (secret) and <out>.pub")
    kg.add_argument("--out", default="enginefoundry-signing",
                    help="path prefix of the two files (default: ./enginefoundry-signing); never overwritten")
    kg.set_defaults(handler=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    key, pub = keygen(Path(args.out))
    kid = key_id(pub.read_bytes())
    if wants_json(args):
        emit_json({"private_key": str(key), "public_key": str(pub), "key_id": kid})
        return EXIT_OK
    console.print(f"private key: {key} (mode 0600; keep it out of git, the store and MLflow)\n"
                  f"public key:  {pub} (key id {kid[:16]}…; give it to verifiers)\n"
                  f"sign builds: export {ENV_KEY_FILE}={key.resolve()}\n"
                  f"verify:      enginefoundry verify <build> --trusted-key {pub}", markup=False, highlight=False)
    return EXIT_OK


def trust_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--trusted-key", action="append", metavar="PUB", default=None,
                     help="a public key whose signatures are accepted (repeatable; `enginefoundry keygen` writes it)")
    cmd.add_argument("--trust-policy", metavar="FILE",
                     help=f"trust policy file: accepted keys with their validity (default ${ENV_TRUST_POLICY})")
    cmd.add_argument("--require-signature", action="store_true", default=None,
                     help=f"refuse an unsigned or unverifiable build (also ${ENV_REQUIRE_SIGNATURE}=1 or the policy)")


def policy_of(args: argparse.Namespace) -> TrustPolicy:
    """The command line's trust options merged with the spec's (publish.require_signature, trusted_keys,
    trust_policy) when a spec is given: keys from both, signatures required when either requires them."""
    spec = _spec_of(args)
    if spec is not None and spec.publish.trust_policy and args.trust_policy:
        raise InputError(f"--trust-policy {args.trust_policy} and the spec's publish.trust_policy "
                         f"{spec.publish.trust_policy}: give one of them")
    cli = consumer_policy(args.trusted_key, args.trust_policy, args.require_signature)
    return cli if spec is None else merged_policy(cli, spec_policy(spec))


def _spec_of(args: argparse.Namespace) -> BuildSpec | None:
    from enginefoundry.spec import load_spec

    path = getattr(args, "spec", None)
    return load_spec(path) if path else None


def check_signatures(args: argparse.Namespace, store: Store, build: PublishedBuild, what: str) -> SignatureVerdict:
    """The signature verdict of a build; SignatureRefused naming each cause when it is required and fails."""
    from enginefoundry.evidence.attest import verify_attestations

    verdict = verify_attestations(store, build, policy_of(args))
    if not verdict.ok:
        raise SignatureRefused(f"{what} refused: {build.uri}: {verdict.line()}")
    return verdict


def export_trust(args: argparse.Namespace) -> None:
    """The trust options as environment for a flow in this process (rollout's promotion step); checked now."""
    policy_of(args)  # a bad key or policy file (also the spec's) fails before any build
    if args.require_signature:
        os.environ[ENV_REQUIRE_SIGNATURE] = "1"
    if args.trust_policy:
        os.environ[ENV_TRUST_POLICY] = str(Path(args.trust_policy).resolve())
    if args.trusted_key:
        os.environ[ENV_TRUSTED_KEYS] = os.pathsep.join(str(Path(k).resolve()) for k in args.trusted_key)


def signing_line(spec: BuildSpec | None = None) -> str:
    """What a run will do about signatures, and whom it trusts; loads the signer so a bad key fails before any
    work."""
    from enginefoundry.evidence.attest import UNSIGNED_HINT

    signer = signer_from_env()
    if signer is None:
        return f"signing: none: new builds are published UNSIGNED ({UNSIGNED_HINT})"
    line = f"signing: new builds signed by {signer.identity}"
    if spec is not None and not spec_policy(spec).keys:
        line += ("; the spec names no trusted key (publish.trusted_keys), so this run trusts exactly this key: the "
                 "signatures of its cache hits, of the inputs it reuses and of what it registers as signed")
    return line
