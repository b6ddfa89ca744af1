"""Fixtures of the e2e tier: the tiny reference bundle, built once, and one server on it, for the session.

Tests that break a bundle copy it; tests that kill a server start their own on `tiny_bundle`; everything that
only reads from a healthy server shares `tiny_served`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from enginefoundry.lanes.reference import ReferenceLane
from enginefoundry.model_server import Endpoint, free_port, serving
from tests.support.bundle import build_tiny_bundle


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's reference bundle (read-only: copy it before changing anything)."""
    return build_tiny_bundle(tmp_path_factory.mktemp("tiny-bundle"))


@pytest.fixture(scope="session")
def tiny_served(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """`transformers serve` on the tiny bundle, shared by the session (do not kill it)."""
    log = tmp_path_factory.mktemp("tiny-serve") / "server.log"
    # Served under the model name, as the pipeline serves it (issue 25).
    cmd = ReferenceLane().named_serve_command(tiny_bundle, "127.0.0.1", free_port(), "tiny-chat")
    with serving(cmd, log) as endpoint:
        yield endpoint
