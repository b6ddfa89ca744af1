"""Signed evidence of a published build: in-toto attestations of its inputs and results (attest), the identities,
DSSE envelopes and trust policies that sign and verify them (signing), and what a statement names (inputs).

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.evidence.attest import (
        UNSIGNED_HINT,
        SignatureVerdict,
        promotion_refusal,
        sign_before_current,
        tags_for,
        verify_attestations,
    )
    from enginefoundry.evidence.inputs import InputTrust
    from enginefoundry.evidence.signing import (
        ENV_KEY_FILE,
        ENV_REQUIRE_SIGNATURE,
        ENV_TRUST_POLICY,
        ENV_TRUSTED_KEYS,
        TrustPolicy,
        consumer_policy,
        key_id,
        keygen,
        merged_policy,
        require_signer_for,
        run_policy,
        signer_from_env,
        spec_policy,
    )

__all__ = [
    "ENV_KEY_FILE",
    "ENV_REQUIRE_SIGNATURE",
    "ENV_TRUSTED_KEYS",
    "ENV_TRUST_POLICY",
    "UNSIGNED_HINT",
    "InputTrust",
    "SignatureVerdict",
    "TrustPolicy",
    "consumer_policy",
    "key_id",
    "keygen",
    "merged_policy",
    "promotion_refusal",
    "require_signer_for",
    "run_policy",
    "sign_before_current",
    "signer_from_env",
    "spec_policy",
    "tags_for",
    "verify_attestations",
]

__getattr__, __dir__ = lazy_face(__name__)
