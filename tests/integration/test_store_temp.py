"""A file:// store stages writes outside every published folder and removes what dead writers left."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from enginefoundry.store.backends import TEMP_DIR, open_store


def test_temp_files_of_dead_writers_are_removed_and_never_land_beside_published_files(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    staging = tmp_path / "store" / TEMP_DIR
    staging.mkdir(parents=True)
    left = staging / f"{host}.{dead.stdout.strip()}.abc.partial"  # a kill -9 mid-write left this
    left.write_bytes(b"half")
    live = staging / f"{host}.{__import__('os').getpid()}.def.partial"  # a writer still at work
    live.write_bytes(b"busy")
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    store.put_file(src, "units/a/f.bin")
    assert not left.exists() and live.exists()
    assert list((tmp_path / "store" / "units").rglob("*.partial")) == []
    assert (tmp_path / "store" / "units" / "a" / "f.bin").read_bytes() == b"x" * 1000
