"""The all-hits run's pending records: a file is recorded by one recorder only, and what a killed recorder
held is given back for the next run."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from enginefoundry.planning import noop_run


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EF_WORK_DIR", str(tmp_path / "work"))
    noop_run.pending_dir().mkdir(parents=True)
    return noop_run.pending_dir()


DEST = noop_run.RecorderDestinations(store="file:///nonexistent-store", mlflow_uri="sqlite:////nonexistent/m.db")


def test_a_claimed_file_is_not_recorded_twice(work: Path):
    assert noop_run.record_pending(work / "gone.json", DEST) is None  # another recorder renamed it first


def test_a_killed_recorders_file_is_given_back_and_young_files_are_left_alone(work: Path):
    stuck = work / "20260101T000000-abc.4242.recording"
    stuck.write_text("{}")
    old = time.time() - 3600
    os.utime(stuck, (old, old))
    young = work / "20260101T000001-def.json"
    young.write_text("{}")
    assert noop_run.flush_pending(DEST, min_age_s=7200) == 0
    assert sorted(p.name for p in work.iterdir()) == ["20260101T000000-abc.json", young.name]


class _Capture(http.server.BaseHTTPRequestHandler):
    """A server a planted record names: it keeps every request's Authorization header."""

    seen: ClassVar[list[str | None]] = []

    def _any(self) -> None:
        _Capture.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = _any

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def capture() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _old(path: Path, age_s: float) -> Path:
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("record", [
    # The shape main wrote: the whole spec, destinations included (a planted one names the attacker's server).
    lambda uri: {"spec": {"tracking": {"mlflow_uri": uri}}, "base_dir": None, "run": {}},
    lambda uri: {"store": DEST.store, "spec": {"tracking": {"mlflow_uri": uri}}, "base_dir": None, "run": {}},
    lambda uri: {"store": DEST.store, "spec": {"publish": {"s3_endpoint_url": uri}}, "base_dir": None, "run": {}},
])
def test_a_planted_record_never_sends_the_token_anywhere(work: Path, capture: str, monkeypatch, record):
    """A pending file naming its own MLflow (or S3 endpoint) is dropped with a message; nothing reaches the URI it
    names, the run's MLFLOW_TRACKING_TOKEN least of all."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "secret-token")
    _Capture.seen.clear()
    planted = work / "20260101T000000-evil.json"
    planted.write_text(json.dumps(record(capture)))
    _old(planted, 3600)
    said: list[str] = []
    assert noop_run.flush_pending(DEST, said.append) == 0
    assert _Capture.seen == []
    assert not planted.exists() and not list(work.iterdir())
    assert len(said) == 1 and "dropped the pending record 20260101T000000-evil.json" in said[0]


def test_a_stale_record_is_dropped_at_once(work: Path):
    """A record no recorder could record in a day never blocks anything: dropped, with a message, without
    reading it; a fresh one of another store is left for a run of that store."""
    stale = work / "20250101T000000-old.json"
    stale.write_text(json.dumps({"spec": {"tracking": {"mlflow_uri": "http://10.255.255.1:5000"}}}))
    _old(stale, noop_run.PENDING_MAX_AGE_S + 60)
    said: list[str] = []
    t0 = time.monotonic()
    assert noop_run.flush_pending(DEST, said.append) == 0
    assert time.monotonic() - t0 < 5
    assert not stale.exists() and "not recorded in 24 h" in said[0]
