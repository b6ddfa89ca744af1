"""kill -9 of a process that is running the predictor (`AIConfigurator`, `aiconfigurator cli exp`,
up to 30 min) leaves no process behind: the tool runs through enginefoundry.runner like every other tool
(its own process group, a parent-death signal, the reaper). A fake `aiconfigurator` stands in for the real one:
it starts a grandchild, as a tool with workers does, then sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from tests.support.processes import marked_processes, poll

REPO = Path(__file__).resolve().parents[2]
MARK = "EF_TEST_PREDICTOR_MARK"


def test_kill_9_while_predicting_leaves_no_process(tmp_path: Path):
    tool = tmp_path / "aiconfigurator"
    tool.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(tmp_path / "started")!r}, "w").close()
        time.sleep(300)
        """))
    tool.chmod(0o755)
    driver = textwrap.dedent(f"""\
        from pathlib import Path
        from enginefoundry.search.predictor import AIConfigurator, Coverage, Request
        from enginefoundry.spec import Precision
        p = AIConfigurator(Path({str(tool)!r}), Path({str(tmp_path / "cache")!r}))
        r = Request(target="h100", precision=Precision.FP8, coverage=Coverage(True, system="h100_sxm",
                    backend="trtllm", db_version="1.0"), config_digest="0" * 64, isl=128, osl=128,
                    ttft_ms=1000.0, tpot_ms=50.0, total_gpus=8, max_gpus_per_replica=8)
        p._run({{"architectures": ["LlamaForCausalLM"]}}, [r], "0.12.0")
        """)
    marker = uuid.uuid4().hex
    env = {**os.environ, MARK: marker, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert poll(lambda: (tmp_path / "started").exists() or proc.poll() is not None, 120), "tool never started"
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert len(marked_processes(MARK, marker)) >= 3  # the driver, the tool, the tool's child
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert poll(lambda: not marked_processes(MARK, marker), 30), marked_processes(MARK, marker)
    finally:
        for line in marked_processes(MARK, marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_a_planted_fifo_in_the_prediction_cache_is_a_miss_not_a_hang(tmp_path: Path):
    """The prediction cache (~/.cache/enginefoundry/predictions) is local state: a FIFO or a link to a device
    named like a cached prediction is a miss (predicted again, the file replaced), never a read that hangs
    `search` or never ends."""
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / ("a" * 64 + ".json"))
    (cache / ("b" * 64 + ".json")).symlink_to("/dev/zero")
    probe = textwrap.dedent(f"""\
        from pathlib import Path
        from enginefoundry.search.predictor import AIConfigurator
        p = AIConfigurator(Path("/nonexistent/aiconfigurator"), Path({str(cache)!r}))
        print(p._cached("a" * 64), p._cached("b" * 64))
        """)
    try:
        done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("reading the prediction cache hung on a planted FIFO or device") from None
    assert done.returncode == 0 and done.stdout.split() == ["None", "None"], done.stdout + done.stderr
