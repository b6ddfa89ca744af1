"""Whether a variant's converted checkpoint is reused, pulled or converted again: the cache policy of the convert
stage (tasks/convert.py), as a pure decision over what the store and the work folder hold.

The stage reads the store (the published build of the checkpoint key, its problems, its signatures) and the work
folder's record (`convert-done.json`); this module decides; the stage then acts (quarantines, pulls, converts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ReuseAction(Enum):
    REUSE_LOCAL = "reuse-local"  # the work folder holds the published build already
    PULL = "pull"  # the published build, fetched into the work folder (each file checked)
    CONVERT = "convert"  # converted here from the source and published


class Refusal(Enum):
    PROBLEMS = "problems"  # the published build failed its check (missing or damaged files)
    UNSIGNED = "unsigned"  # this run signs its build, and no trusted key signed the published one


@dataclass(frozen=True)
class ReuseDecision:
    action: ReuseAction
    refusal: Refusal | None = None  # why the published build was refused, where it was
    refused_build: str | None = None  # the build id refused: the new build replaces it, never adopts it back


@dataclass(frozen=True)
class PublishedCheckpoint:
    """What the decision reads of the published build of the checkpoint key (store.publish.PublishedBuild)."""

    build_id: str
    manifest_sha256: str
    has_checkpoint: bool  # a converted checkpoint's manifest (a unit's build is never reused as one)


def decide_checkpoint_reuse(published: PublishedCheckpoint | None, *, problems: bool, signing: bool,
                            signed: bool, local_holds: str | None) -> ReuseDecision:
    """`problems`: the published build's check found some. `signing`: this run signs its build, so it reuses only
    a build a trusted key `signed`. `local_holds`: the manifest digest of the published build the work folder
    holds (None: no folder, or the source itself passed through)."""
    if published is None:
        return ReuseDecision(ReuseAction.CONVERT)
    if problems:
        return ReuseDecision(ReuseAction.CONVERT, Refusal.PROBLEMS, published.build_id)
    if signing and not signed:
        return ReuseDecision(ReuseAction.CONVERT, Refusal.UNSIGNED, published.build_id)
    if not published.has_checkpoint:
        return ReuseDecision(ReuseAction.CONVERT)
    if local_holds == published.manifest_sha256:
        return ReuseDecision(ReuseAction.REUSE_LOCAL)
    return ReuseDecision(ReuseAction.PULL)
