"""planning/checkpoint_reuse.py: the convert stage's cache policy, decided from what the store and the work
folder hold (no store, no process)."""

from __future__ import annotations

import pytest

from enginefoundry.planning.checkpoint_reuse import (
    PublishedCheckpoint,
    Refusal,
    ReuseAction,
    ReuseDecision,
    decide_checkpoint_reuse,
)

BUILD = PublishedCheckpoint(build_id="b1", manifest_sha256="a" * 64, has_checkpoint=True)


def decide(published: PublishedCheckpoint | None = BUILD, *, problems: bool = False, signing: bool = False,
           signed: bool = False, local_holds: str | None = None) -> ReuseDecision:
    return decide_checkpoint_reuse(published, problems=problems, signing=signing, signed=signed,
                                   local_holds=local_holds)


def test_nothing_published_is_converted_and_replaces_nothing():
    assert decide(None) == ReuseDecision(ReuseAction.CONVERT)


def test_a_work_folder_holding_the_published_build_is_reused_as_it_is():
    assert decide(local_holds="a" * 64).action is ReuseAction.REUSE_LOCAL


@pytest.mark.parametrize("local", [None, "b" * 64])
def test_a_folder_without_it_or_with_another_build_pulls_the_published_one(local: str | None):
    assert decide(local_holds=local) == ReuseDecision(ReuseAction.PULL)


def test_a_damaged_build_is_refused_and_replaced_even_where_the_folder_holds_it():
    assert decide(problems=True, local_holds="a" * 64) == ReuseDecision(ReuseAction.CONVERT, Refusal.PROBLEMS, "b1")


def test_a_signing_run_refuses_an_unsigned_build_and_reuses_a_signed_one():
    assert decide(signing=True, signed=False) == ReuseDecision(ReuseAction.CONVERT, Refusal.UNSIGNED, "b1")
    assert decide(signing=True, signed=True, local_holds="a" * 64).action is ReuseAction.REUSE_LOCAL
    assert decide(signing=False, signed=False).action is ReuseAction.PULL  # a run that does not sign trusts the check


def test_a_build_that_is_not_a_converted_checkpoint_is_converted_without_replacing_it():
    unit_build = PublishedCheckpoint(build_id="u", manifest_sha256="a" * 64, has_checkpoint=False)
    assert decide(unit_build, local_holds="a" * 64) == ReuseDecision(ReuseAction.CONVERT)
