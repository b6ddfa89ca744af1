"""A pending record is local state, and local state is hostile input: a FIFO (or a link to one, or to a device)
planted as `work/pending-hits/<name>.json` must not hang the background recorder for ever. A hung recorder is a
process nobody waits for, and every later run starts another one for the same file (given back after 10 min)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLUSH = """
from enginefoundry.planning import noop_run
dest = noop_run.RecorderDestinations(store="file:///nonexistent-store", mlflow_uri="sqlite:////nonexistent/m.db")
noop_run.flush_pending(dest, print)
"""


@pytest.mark.parametrize("plant", ["fifo", "link-to-fifo", "link-to-device"])
def test_a_planted_fifo_or_device_never_hangs_the_recorder(tmp_path: Path, plant: str):
    pending = tmp_path / "work" / "pending-hits"
    pending.mkdir(parents=True)
    planted = pending / "20260101T000000-planted.json"
    if plant == "fifo":
        os.mkfifo(planted)
    elif plant == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        planted.symlink_to(tmp_path / "fifo")
    else:
        planted.symlink_to("/dev/zero")
    old = time.time() - 3600
    os.utime(planted, (old, old), follow_symlinks=False)
    if plant == "link-to-fifo":
        os.utime(tmp_path / "fifo", (old, old))  # the age is read through the link
    env = {**os.environ, "EF_WORK_DIR": str(tmp_path / "work"), "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", FLUSH], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the recorder hung on a planted {plant}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dropped the pending record 20260101T000000-planted.json" in done.stdout, done.stdout
    assert not list(pending.iterdir())


def test_a_dangling_link_is_dropped_not_a_crash(tmp_path: Path):
    pending = tmp_path / "work" / "pending-hits"
    pending.mkdir(parents=True)
    planted = pending / "20260101T000000-dangling.json"
    planted.symlink_to(tmp_path / "nowhere")
    old = time.time() - 3600
    os.utime(planted, (old, old), follow_symlinks=False)
    env = {**os.environ, "EF_WORK_DIR": str(tmp_path / "work"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", FLUSH], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dropped the pending record 20260101T000000-dangling.json" in done.stdout, done.stdout


def test_a_toolchain_channel_that_is_a_fifo_is_refused_not_a_hang(tmp_path: Path):
    """toolchain.channel is a spec field (hostile input): naming a FIFO (or a device) must be refused with the
    field, not block `plan`, `validate` or `rollout` for ever on the read."""
    os.mkfifo(tmp_path / "channel.yaml")
    probe = f"""
from pathlib import Path
from enginefoundry.errors import SpecError
from enginefoundry.rollout.toolchain_channel import read_channel
for uri in ("channel.yaml", "/dev/zero"):
    try:
        read_channel(uri, Path({str(tmp_path)!r}))
    except SpecError as err:
        print("refused", err.problems[0][0])
"""
    try:
        done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a toolchain channel that is a FIFO hung")
    assert done.stdout.split("\n")[:2] == ["refused toolchain.channel"] * 2, done.stdout + done.stderr
