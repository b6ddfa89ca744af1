"""The store's layout: every object prefix and key shape, in one place.

    blobs/sha256/<ab>/<digest>                                  every file and signed bundle, written once
    manifests/<model>/<key>/<build-id>.json                     one immutable manifest per build (unit or checkpoint)
    manifests/<model>/<key>/current.json                        the key's pointer (compare-and-swap)
    attestations/<model>/<key>/<build-id>.json                  a build's signed-attestation index
    input-attestations/<kind>/<key>/<key id>/<digest>.json      a signed statement over an input a build reused
    verifications/<model>/<key>/<build-id>/<time>.json          what `verify` found, one record per check
    leases/<model>/<unit key>.json                              a build lease (+ `.broken-<holder>` notes beside it)
    quarantine/<key>.<time>-<random>                            a corrupt object, moved aside
    references/<digest>.json                                    smoke-gate reference answers
    references/<digest>.spread.v2.json                          their measured spread at the reference's precision
    runs/<model>/<parent run id>/<unit>.json                    a cluster unit's outcome, read by its parent run
    artifacts/<model>/<key>/manifest.json (+ files)             version 1 units (read only)
    checkpoints/<model>/<key>/manifest.json (+ files)           version 1 converted checkpoints (read only)

Every other module builds keys through these functions; tests/unit/test_store_layout.py fails when a prefix is
spelled anywhere else. Model names, keys and build ids are single confined path segments (StoreError otherwise).
"""

from __future__ import annotations

from enginefoundry.confine import relative_posix
from enginefoundry.errors import StoreError

BLOB_PREFIX = "blobs/sha256"
MANIFESTS = "manifests"
POINTER_NAME = "current.json"
ATTESTATIONS = "attestations"
INPUT_ATTESTATIONS = "input-attestations"
VERIFICATIONS = "verifications"
LEASES = "leases"
QUARANTINE = "quarantine"
REFERENCES = "references"
RUN_OUTCOMES = "runs"
LEGACY_UNITS = "artifacts"
LEGACY_CHECKPOINTS = "checkpoints"
LEGACY_MANIFEST_NAME = "manifest.json"

# Every top-level prefix (tests/unit/test_store_layout.py greps the code for them).
PREFIXES = (BLOB_PREFIX.split("/")[0], MANIFESTS, ATTESTATIONS, INPUT_ATTESTATIONS, VERIFICATIONS, LEASES, QUARANTINE,
            REFERENCES, RUN_OUTCOMES, LEGACY_UNITS, LEGACY_CHECKPOINTS)
# The folders a build's URI may name, the current layout first.
BUILD_FOLDERS = (MANIFESTS, LEGACY_UNITS, LEGACY_CHECKPOINTS)

# What a user is told a build reference looks like (CLI help, error messages).
BUILD_URI_SHAPE = f"<store>/{MANIFESTS}/<model>/<key>"
LEGACY_URI_SHAPE = f"<store>/{LEGACY_UNITS}/<model>/<key>"
QUARANTINE_SHAPE = f"<store>/{QUARANTINE}/…"


def segment(value: str, what: str) -> str:
    """`value` as one confined path segment of a key; StoreError naming `what` otherwise."""
    try:
        relative_posix(value, what)
    except ValueError as err:
        raise StoreError(str(err)) from None
    if "/" in value:
        raise StoreError(f"{what}: {value!r} must be one path segment")
    return value


def blob_key(digest: str) -> str:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise StoreError(f"{digest!r} is not a sha256 hex digest")
    return f"{BLOB_PREFIX}/{digest[:2]}/{digest}"


def is_blob_key(key: str) -> bool:
    return key.startswith(f"{BLOB_PREFIX}/")


def manifests_prefix(model: str, key: str) -> str:
    return f"{MANIFESTS}/{segment(model, 'model name')}/{segment(key, 'key')}"


def pointer_key(model: str, key: str) -> str:
    return f"{manifests_prefix(model, key)}/{POINTER_NAME}"


def build_manifest_key(model: str, key: str, build_id: str) -> str:
    return f"{manifests_prefix(model, key)}/{segment(build_id, 'build id')}.json"


def legacy_unit_prefix(model: str, key: str) -> str:
    return f"{LEGACY_UNITS}/{segment(model, 'model name')}/{segment(key, 'key')}"


def legacy_checkpoint_prefix(model: str, key: str) -> str:
    return f"{LEGACY_CHECKPOINTS}/{segment(model, 'model name')}/{segment(key, 'key')}"


def legacy_manifest_key(prefix: str) -> str:
    """The version 1 manifest in a `legacy_unit_prefix` / `legacy_checkpoint_prefix` folder."""
    return f"{prefix}/{LEGACY_MANIFEST_NAME}"


def attestation_index_key(model: str, key: str, build_id: str) -> str:
    return f"{ATTESTATIONS}/{segment(model, 'model name')}/{segment(key, 'key')}/{segment(build_id, 'build id')}.json"


def input_attestations_prefix(kind: str, key: str, key_id: str) -> str:
    """The signed statements of one signer (its key id) over an input of `kind` and `key` that builds reuse (a converted
    checkpoint, reference answers, their spread): evidence/inputs.py. Each is named by its own sha256."""
    return (f"{INPUT_ATTESTATIONS}/{segment(kind, 'input kind')}/{segment(key, 'key')}/"
            f"{segment(key_id, 'key id')}/")


def verification_prefix(model: str, key: str, build_id: str) -> str:
    return f"{VERIFICATIONS}/{model}/{key}/{build_id}"


def lease_key(model: str, unit_key: str) -> str:
    return f"{LEASES}/{model}/{unit_key}.json"


def leases_prefix() -> str:
    return f"{LEASES}/"


def is_lease_key(key: str) -> bool:
    return key.startswith(leases_prefix())


def quarantine_key(key: str, suffix: str) -> str:
    """Where a corrupt object at `key` is moved aside (`suffix`: time and a random part)."""
    return f"{QUARANTINE}/{key}.{suffix}"


def reference_answers_key(digest: str) -> str:
    """Smoke-gate reference answers, by the digest of their key (smoke/reference.py)."""
    return f"{REFERENCES}/{digest}.json"


def reference_spread_key(digest: str) -> str:
    """The spread between two healthy computations of those reference answers (smoke/reference.py). v2: with
    each prompt's share (LogprobSpread.per_prompt, for slices); a v1 `<digest>.spread.json` is never read."""
    return f"{REFERENCES}/{digest}.spread.v2.json"


def run_outcome_key(model: str, parent_run_id: str, unit_name: str) -> str:
    """A cluster unit's outcome, left by its worker for the parent run (flows/dispatch.py)."""
    return f"{RUN_OUTCOMES}/{model}/{parent_run_id}/{unit_name}.json"


def listing_folders(model: str | None, units_only: bool = False) -> list[str]:
    """The folders to list for every build key (of `model`, else of all models), current layout first;
    `units_only`: without version 1 converted checkpoints."""
    folders = BUILD_FOLDERS[:2] if units_only else BUILD_FOLDERS
    return [f"{folder}/" + (f"{model}/" if model else "") for folder in folders]


def key_of_listing(name: str, model: str | None = None) -> tuple[str, str, str] | None:
    """(folder, model, key) when a listed object name is a key's pointer or version 1 manifest, else None."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] not in BUILD_FOLDERS or (model is not None and parts[1] != model):
        return None
    expected = POINTER_NAME if parts[0] == MANIFESTS else LEGACY_MANIFEST_NAME
    return (parts[0], parts[1], parts[2]) if parts[3] == expected else None


def build_uri(store_uri: str, folder: str, model: str, key: str) -> str:
    return f"{store_uri}/{folder}/{model}/{key}"


def split_build_uri(uri: str) -> tuple[str, str, str, str, str | None] | None:
    """(store URI, folder, model, key, file name or None) of a build URI in either layout; None when `uri`
    names no build folder."""
    uri = uri.rstrip("/")
    for folder in BUILD_FOLDERS:
        root, sep, rest = uri.rpartition(f"/{folder}/")
        if not sep:
            continue
        parts = rest.split("/")
        if len(parts) < 2 or len(parts) > 3:
            continue
        name = parts[2] if len(parts) == 3 else None
        if folder != MANIFESTS and name not in (None, LEGACY_MANIFEST_NAME):
            continue
        return root, folder, parts[0], parts[1], name
    return None


def store_of_build_uri(uri: str) -> str:
    """The store URI of a build URI of the current layout (everything before `/manifests/`)."""
    return uri.rsplit(f"/{MANIFESTS}/", 1)[0]


def legacy_manifest_uri(folder_uri: str) -> str:
    return f"{folder_uri.rstrip('/')}/{LEGACY_MANIFEST_NAME}"
