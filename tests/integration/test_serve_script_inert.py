"""Generated shell is inert: hostile values through every field that reaches serve.sh never execute.

serve.sh is checked with `bash -n` and `sh -n`, then run in a sandbox folder where the server binary is a
script that records its argv: the argv must equal the values exactly and no PWNED file may appear.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from enginefoundry.confine import UnsafePathError
from enginefoundry.lanes import get_lane
from enginefoundry.lanes.serve_files import SERVE_SH, SERVE_YAML, ServingPlan, serving_plan, write_serving_files
from enginefoundry.store.permissions import current_umask

# Each would create PWNED (or print) if a shell ever evaluated it.
HOSTILE = [
    "$(touch PWNED)", "`touch PWNED`", "'; touch PWNED; '", '"; touch PWNED; "', "a b\tc",
    "x\ntouch PWNED\n", "; touch PWNED", "&& touch PWNED", "| touch PWNED", "$((1+1))", "${HOME}", "$HOME",
    "\\$(touch PWNED)", "'$(touch PWNED)'", '"$(touch PWNED)"', "-n", "--", "#not a comment", "*", "~",
]

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in json.loads(os.environ["ENV_KEYS"])}},
               "links": {{n: os.readlink(n) for n in os.listdir(".") if os.path.islink(n)}}}}, f)
"""


def _run_sandboxed(script: Path, sandbox: Path, binary: str, env_keys: list[str], extra_env: dict[str, str],
                   shell: str) -> dict:
    bindir = sandbox / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / binary
    fake.write_text(RECORDER.format(python=sys.executable))
    fake.chmod(0o755)
    out = sandbox / "argv.json"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "ARGV_OUT": str(out), "ENV_KEYS": json.dumps(env_keys),
           "HOME": str(sandbox), "TMPDIR": str(sandbox), **extra_env}
    done = subprocess.run([shell, str(script)], cwd=sandbox, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _no_pwned(*roots: Path) -> None:
    for root in roots:
        assert not [p for p in root.rglob("PWNED*")], f"a hostile value executed under {root}"


def _syntax_ok(script: Path) -> None:
    for shell in ("bash", "sh"):
        check = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{shell} -n: {check.stderr}"


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_hostile_values_in_every_field_stay_literal(tmp_path: Path, shell: str) -> None:
    unit_dir = tmp_path / "unit $(touch PWNED) `touch PWNED`"
    plan = ServingPlan(
        unit="fp32-tp1.chat.cpu\n$(touch PWNED)", lane="reference\ntouch PWNED", model="tiny\n`touch PWNED`",
        key="k" * 64, artifact_uri="s3://b/x/$(touch PWNED)`touch PWNED`';\"\ntouch PWNED",
        argv=["fake-server", "serve", "${EF_UNIT_DIR}/bundle/$(touch PWNED)", *HOSTILE,
              "--host", "${HOST}", "--port", "${PORT}", "pre${PORT}post'$(touch PWNED)'"],
        env={"OMP_NUM_THREADS": "1", "EF_HOSTILE": "$(touch PWNED)`touch PWNED`\n; touch PWNED",
             "EF_PATH": "${EF_UNIT_DIR}/x $(touch PWNED)"},
        health_path="/health\ntouch PWNED", openai_model_name="${EF_UNIT_DIR}/m\n$(touch PWNED)",
        needs={"EF_UNIT_DIR": "the unit folder from s3://b/$(touch PWNED)`touch PWNED`'\"\n; touch PWNED"},
        links={"tiny-chat": "${EF_UNIT_DIR}/bundle/$(touch PWNED)`touch PWNED`"},
    )
    files = write_serving_files(plan, tmp_path / "serving")
    script = tmp_path / "serving" / SERVE_SH
    _syntax_ok(script)
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    got = _run_sandboxed(script, sandbox, "fake-server", ["EF_HOSTILE", "EF_PATH", "OMP_NUM_THREADS"],
                         {"EF_UNIT_DIR": str(unit_dir), "HOST": "127.0.0.1", "PORT": "9999"}, shell)
    expected = [a.replace("${EF_UNIT_DIR}", str(unit_dir)).replace("${HOST}", "127.0.0.1").replace("${PORT}", "9999")
                for a in plan.argv[1:]]
    assert got["argv"] == expected
    assert got["env"] == {"EF_HOSTILE": plan.env["EF_HOSTILE"], "EF_PATH": f"{unit_dir}/x $(touch PWNED)",
                          "OMP_NUM_THREADS": "1"}
    assert got["links"] == {"tiny-chat": f"{unit_dir}/bundle/$(touch PWNED)`touch PWNED`"}
    _no_pwned(tmp_path)
    # The missing-variable check prints the hostile URI as text and stops, executing nothing.
    missing = subprocess.run([shell, str(script)], cwd=sandbox, capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2
    assert "$(touch PWNED)`touch PWNED`" in missing.stderr
    _no_pwned(tmp_path)
    assert [f.name for f in files] == [SERVE_SH, SERVE_YAML]


def test_reference_lane_plan_with_hostile_paths_and_store_uri(tmp_path: Path) -> None:
    """The real reference lane's command, from a work folder and a store URI full of shell syntax."""
    work = tmp_path / "work $(touch PWNED) `touch PWNED` ';\"x"
    bundle = work / "bundle"
    (bundle / "model").mkdir(parents=True)
    (bundle / "bundle.json").write_text(json.dumps({"params": {"device": "cpu"}}))
    store_uri = "s3://bucket/$(touch PWNED)/`touch PWNED`/'\";touch PWNED"
    plan = serving_plan(get_lane("reference"), bundle, unit="fp32-tp1.chat.cpu", model="tiny-chat", key="a" * 64,
                        artifact_uri=f"{store_uri}/units/x", checkpoint_dir=work / "checkpoint $(touch PWNED)",
                        checkpoint_uri=f"{store_uri}/ckpt")
    write_serving_files(plan, tmp_path / "serving")
    script = tmp_path / "serving" / SERVE_SH
    _syntax_ok(script)
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    unit_dir = tmp_path / "unpacked `touch PWNED`"
    got = _run_sandboxed(script, sandbox, "transformers", ["HF_HUB_OFFLINE"],
                         {"EF_UNIT_DIR": str(unit_dir), "PORT": "8123"}, "sh")
    # Loopback unless HOST is set: the endpoint has no authentication (issue 25).
    # Served under the model's name (issue 25), from a private folder where the name links to the model.
    assert plan.openai_model_name == "tiny-chat"
    assert got["links"] == {"tiny-chat": f"{unit_dir}/bundle/model"}
    assert got["argv"] == ["serve", "tiny-chat", "--host", "127.0.0.1", "--port", "8123",
                           "--device", "cpu"]
    assert got["env"] == {"HF_HUB_OFFLINE": "1"}
    _no_pwned(tmp_path)


@pytest.mark.parametrize("name", ["../x", "a/b", "x\ntouch PWNED", "$(touch PWNED)", "-rf"])
def test_a_link_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, name: str) -> None:
    plan = ServingPlan(unit="u", lane="reference", model="m", key="k", artifact_uri="file:///s", argv=["x", name],
                       env={}, health_path="/health", openai_model_name=name, links={name: "${EF_UNIT_DIR}/m"})
    with pytest.raises(UnsafePathError, match=r"serve\.sh link name"):
        write_serving_files(plan, tmp_path / "serving")
    assert not (tmp_path / "serving" / SERVE_SH).exists()


def test_serving_files_follow_the_umask_and_serve_sh_stays_executable(tmp_path: Path) -> None:
    plan = ServingPlan(unit="u", lane="reference", model="m", key="k", artifact_uri="file:///s", argv=["x"],
                       env={}, health_path="/health", openai_model_name="m")
    for umask in (0o022, 0o027, 0o002):
        old = os.umask(umask)
        try:
            assert current_umask() == umask
            out = tmp_path / f"u{umask:o}"
            write_serving_files(plan, out)
        finally:
            os.umask(old)
        assert stat.S_IMODE((out / SERVE_SH).stat().st_mode) == 0o777 & ~umask
        assert stat.S_IMODE((out / SERVE_YAML).stat().st_mode) == 0o666 & ~umask
        assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_the_link_folder_is_reused_and_must_be_this_users(tmp_path: Path) -> None:
    """Every start of serve.sh uses one folder per set of link targets, so nothing piles up in $TMPDIR; a
    folder root that is a symlink (planted by someone else) is refused before anything runs."""
    plan = ServingPlan(unit="u", lane="reference", model="m", key="k", artifact_uri="file:///s", argv=["srv", "m"],
                       env={}, health_path="/health", openai_model_name="m", links={"m": "${EF_UNIT_DIR}/model"})
    write_serving_files(plan, tmp_path / "serving")
    script = tmp_path / "serving" / SERVE_SH
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    for unit_dir in ("/units/a", "/units/a", "/units/b"):
        got = _run_sandboxed(script, sandbox, "srv", [], {"EF_UNIT_DIR": unit_dir}, "sh")
        assert got["links"] == {"m": f"{unit_dir}/model"}
    root = sandbox / f"ef-serve-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert len(list(root.iterdir())) == 2  # one per unit folder, not one per start

    elsewhere = tmp_path / "planted"
    elsewhere.mkdir()
    root.rename(tmp_path / "old-root")
    root.symlink_to(elsewhere)
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(sandbox), "EF_UNIT_DIR": "/units/a"}
    done = subprocess.run(["sh", str(script)], cwd=sandbox, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "not a private folder of this user" in done.stderr
    assert not list(elsewhere.iterdir())
