"""The content-addressed store: backends (file://, s3://), the layout of every object prefix, publish and verify
of a build, leases, the unit manifest, unit status, the S3 client and permissions.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.store.backends import Store, clone_or_copy, link_or_copy, open_store
    from enginefoundry.store.layout import (
        BUILD_URI_SHAPE,
        LEGACY_URI_SHAPE,
        QUARANTINE_SHAPE,
        attestation_index_key,
        blob_key,
        input_attestations_prefix,
        lease_key,
        legacy_manifest_uri,
        manifests_prefix,
        run_outcome_key,
        store_of_build_uri,
    )
    from enginefoundry.store.lease import (
        DEFAULT_TTL_S,
        HeldLease,
        break_lease,
        list_leases,
        new_owner,
        try_acquire,
        wait_for,
    )
    from enginefoundry.store.manifest import BuildInput, InputFile, InputKind, Manifest
    from enginefoundry.store.permissions import write_file_atomic
    from enginefoundry.store.publish import (
        PublishedBuild,
        PublishResult,
        anchor_problems,
        check_hit,
        current_build_id,
        find_checkpoint_build,
        find_current,
        publish_build,
        publish_checkpoint_build,
        quarantine_problems,
        read_build,
    )
    from enginefoundry.store.s3 import s3_client, s3_endpoint
    from enginefoundry.store.unit_status import PASSED_GATES, RegistryStatus, UnitStatus
    from enginefoundry.store.verify import VerifyReport, find_by_key, last_verified, open_build, pull, verify_build

__all__ = [
    "BUILD_URI_SHAPE",
    "DEFAULT_TTL_S",
    "LEGACY_URI_SHAPE",
    "PASSED_GATES",
    "QUARANTINE_SHAPE",
    "BuildInput",
    "HeldLease",
    "InputFile",
    "InputKind",
    "Manifest",
    "PublishResult",
    "PublishedBuild",
    "RegistryStatus",
    "Store",
    "UnitStatus",
    "VerifyReport",
    "anchor_problems",
    "attestation_index_key",
    "blob_key",
    "break_lease",
    "check_hit",
    "clone_or_copy",
    "current_build_id",
    "find_by_key",
    "find_checkpoint_build",
    "find_current",
    "input_attestations_prefix",
    "last_verified",
    "lease_key",
    "legacy_manifest_uri",
    "link_or_copy",
    "list_leases",
    "manifests_prefix",
    "new_owner",
    "open_build",
    "open_store",
    "publish_build",
    "publish_checkpoint_build",
    "pull",
    "quarantine_problems",
    "read_build",
    "run_outcome_key",
    "s3_client",
    "s3_endpoint",
    "store_of_build_uri",
    "try_acquire",
    "verify_build",
    "wait_for",
    "write_file_atomic",
]

__getattr__, __dir__ = lazy_face(__name__)
