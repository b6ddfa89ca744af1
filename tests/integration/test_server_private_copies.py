"""A server that writes back into a file it was given (TensorRT-LLM's autotuner cache) gets a private copy in its
working folder, made afresh at each start: the bundle's file never changes, and the copy goes with the run's
folder (model_server) or lives in the one reused folder per unit (serve.sh), not in a new $TMPDIR folder per start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.confine import UnsafePathError
from enginefoundry.lanes.base import SERVE_CWD_VAR, Command, ServeCommand
from enginefoundry.lanes.serve_files import SERVE_SH, ServingPlan, serve_script, write_serving_files
from enginefoundry.model_server import free_port, start_server, stop_server

# Saves into the file it was pointed at (as TensorRT-LLM saves its cache), then answers /health.
SERVER = """
import http.server, os, sys
path = os.environ["TLLM_AUTOTUNER_CACHE_PATH"]
with open(path, "ab") as f:
    f.write(b" + tuned")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
"""


def test_the_model_server_serves_a_fresh_copy_in_its_working_folder(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "autotuner.cache").write_bytes(b"tactics")
    port = free_port()
    cmd = ServeCommand(command=Command(argv=[sys.executable, "-c", SERVER, "--port", str(port)],
                                       env={"TLLM_AUTOTUNER_CACHE_PATH": f"${{{SERVE_CWD_VAR}}}/autotuner.cache"}),
                       model_name="m", tokenizer_dir=str(bundle),
                       copies={"autotuner.cache": str(bundle / "autotuner.cache")})
    for start in (1, 2):
        endpoint = start_server(cmd, tmp_path / "run" / "server.log", timeout_s=60)
        stop_server(endpoint.pid)
        copy = tmp_path / "run" / "serve-cwd" / "autotuner.cache"
        assert copy.read_bytes() == b"tactics + tuned", start  # afresh: not "tactics + tuned + tuned"
        assert f"TLLM_AUTOTUNER_CACHE_PATH={copy}" in endpoint.command  # the run records the real path
    assert (bundle / "autotuner.cache").read_bytes() == b"tactics"


RECORDER = """#!{python}
import json, os
path = os.environ["TLLM_AUTOTUNER_CACHE_PATH"]
with open(path, "rb") as f:
    seen = f.read().decode()
with open(path, "ab") as f:
    f.write(b" + tuned")
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump({{"path": path, "seen": seen, "cwd": os.getcwd()}}, f)
"""


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_serve_sh_copies_the_units_file_afresh_at_each_start(tmp_path: Path, shell: str) -> None:
    unit_dir = tmp_path / "unit $(touch PWNED)"
    (unit_dir / "bundle").mkdir(parents=True)
    (unit_dir / "bundle" / "autotuner.cache").write_bytes(b"tactics")
    plan = ServingPlan(unit="u", lane="trtllm", model="m", key="k", artifact_uri="file:///s", argv=["srv"],
                       env={"TLLM_AUTOTUNER_CACHE_PATH": f"${{{SERVE_CWD_VAR}}}/autotuner.cache"},
                       health_path="/health", openai_model_name="m",
                       copies={"autotuner.cache": "${EF_UNIT_DIR}/bundle/autotuner.cache"})
    write_serving_files(plan, tmp_path / "serving")
    sandbox = tmp_path / "sandbox"
    (sandbox / "bin").mkdir(parents=True)
    (sandbox / "bin" / "srv").write_text(RECORDER.format(python=sys.executable))
    (sandbox / "bin" / "srv").chmod(0o755)
    env = {"PATH": f"{sandbox / 'bin'}:/usr/bin:/bin", "ARGV_OUT": str(sandbox / "out.json"), "HOME": str(sandbox),
           "TMPDIR": str(sandbox), "EF_UNIT_DIR": str(unit_dir)}
    for _ in (1, 2):
        done = subprocess.run([shell, str(tmp_path / "serving" / SERVE_SH)], cwd=sandbox, env=env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        got = json.loads((sandbox / "out.json").read_text())
        assert got["seen"] == "tactics"  # the unit's own file, not what the last start saved
        assert Path(got["path"]).parent == Path(got["cwd"])
        assert Path(got["cwd"]).parent == sandbox / f"ef-serve-{os.getuid()}"
    assert (unit_dir / "bundle" / "autotuner.cache").read_bytes() == b"tactics"
    assert len(list((sandbox / f"ef-serve-{os.getuid()}").iterdir())) == 1  # one folder, reused
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "$(touch PWNED)"])
def test_a_copy_name_that_is_not_a_plain_file_name_is_refused(name: str) -> None:
    plan = ServingPlan(unit="u", lane="trtllm", model="m", key="k", artifact_uri="file:///s", argv=["srv"], env={},
                       health_path="/health", openai_model_name="m", copies={name: "${EF_UNIT_DIR}/bundle/x"})
    with pytest.raises(UnsafePathError):
        serve_script(plan)
