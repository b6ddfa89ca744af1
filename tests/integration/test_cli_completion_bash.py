"""The completion script in a real bash (a process: moved out of tests/unit/test_cli_options.py, the unit tier starts
none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefoundry.cli import main


def test_bash_accepts_the_completion_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The generated script is valid bash (syntax check only: `bash -n`, no shell session)."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    main(["completion", "bash"])
    script = tmp_path / "c.bash"
    script.write_text(capsys.readouterr().out)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
