"""Serving outputs: the files a serving team deploys a unit with, written beside its bundle.

`serving/serve.sh` (the command line), `serving/serve.yaml` (the same as data: argv, env, health path, the
OpenAI `model` name, what must be downloaded) and, for engine bundles, where the Triton model repository
lies and how to launch it. They come from the lane's own `serve_command`, built against the local bundle
and then made relocatable: the bundle path becomes `${EF_UNIT_DIR}/bundle`, a checkpoint outside the bundle
`${EF_CHECKPOINT_DIR}`, host and port `${HOST}`/`${PORT}`, so the files work wherever the unit is unpacked.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from enginefoundry.confine import check_name
from enginefoundry.lanes.base import BUNDLE_INFO, SERVE_CWD_VAR, BundleInfo, Lane, TritonSettings
from enginefoundry.store.permissions import write_file_atomic

UNIT_DIR_VAR = "EF_UNIT_DIR"
CHECKPOINT_VAR = "EF_CHECKPOINT_DIR"
DEFAULT_PORT = 8000
# Sentinels given to serve_command, replaced by shell variables afterwards (no real address looks like them).
_HOST_SENTINEL = "ef-serve-host.invalid"
_PORT_SENTINEL = 48_123
SERVE_SH = "serve.sh"
SERVE_YAML = "serve.yaml"


class ServingTriton(BaseModel):
    """serve.yaml `triton`: the engine bundle's Triton model repository and its launch command, relocated."""

    model_repository: str
    bundle_mount: str
    launch: list[str]


class ServingPlan(BaseModel):
    """The relocatable serve command of one unit."""

    unit: str
    lane: str
    model: str
    key: str
    artifact_uri: str = Field(description="the unit's store folder; download it and point EF_UNIT_DIR at it")
    argv: list[str]
    env: dict[str, str]
    health_path: str
    openai_model_name: str = Field(description="the `model` field requests must carry")
    default_port: int = DEFAULT_PORT
    needs: dict[str, str] = Field(default_factory=dict, description="variables to set before serving")
    triton: ServingTriton | None = None
    links: dict[str, str] = Field(default_factory=dict, description="names the server's working folder holds, "
                                  "as symbolic links to these paths (serve.sh makes the folder with mktemp)")
    copies: dict[str, str] = Field(default_factory=dict, description="names the server's working folder holds as "
                                   "copies of these files, made afresh at each start (files the server writes "
                                   "back into); an env value names that folder as ${EF_SERVE_CWD}")


def _relocate(text: str, paths: dict[str, str]) -> str:
    # Longest first, so a bundle path inside a checkpoint path (or the reverse) is replaced whole.
    for local, var in sorted(paths.items(), key=lambda kv: len(kv[0]), reverse=True):
        text = text.replace(local, var)
    return text.replace(_HOST_SENTINEL, "${HOST}").replace(str(_PORT_SENTINEL), "${PORT}")


def serving_plan(lane: Lane, bundle_dir: Path, *, unit: str, model: str, key: str, artifact_uri: str,
                 checkpoint_dir: Path | None, checkpoint_uri: str | None) -> ServingPlan:
    bundle = Path(bundle_dir).resolve()
    cmd = lane.named_serve_command(bundle, _HOST_SENTINEL, _PORT_SENTINEL, model)
    paths = {str(bundle): f"${{{UNIT_DIR_VAR}}}/bundle"}
    needs = {UNIT_DIR_VAR: f"the unit folder downloaded from {artifact_uri} (it holds bundle/)"}
    if checkpoint_dir is not None and not Path(checkpoint_dir).resolve().is_relative_to(bundle):
        paths[str(Path(checkpoint_dir).resolve())] = f"${{{CHECKPOINT_VAR}}}"
        if any(str(Path(checkpoint_dir).resolve()) in a for a in [*cmd.command.argv, *cmd.command.env.values()]):
            needs[CHECKPOINT_VAR] = f"the converted checkpoint downloaded from {checkpoint_uri or 'the source'}"
    # A console script is called by name: the serving image has its own install of the tool.
    argv = [Path(cmd.command.argv[0]).name, *(_relocate(a, paths) for a in cmd.command.argv[1:])]
    env = {k: _relocate(v, paths) for k, v in cmd.command.env.items()}
    info = BundleInfo.read(bundle) if (bundle / BUNDLE_INFO).is_file() else BundleInfo()
    triton = None
    if info.triton_model_repo:
        given = info.triton or TritonSettings()
        triton = ServingTriton(model_repository=f"${{{UNIT_DIR_VAR}}}/bundle/{info.triton_model_repo}",
                               bundle_mount=_relocate(str(given.bundle_mount or ""), paths),
                               launch=[_relocate(str(a), paths) for a in given.launch])
    return ServingPlan(unit=unit, lane=lane.name, model=model, key=key, artifact_uri=artifact_uri, argv=argv,
                       env=env, health_path=cmd.health_path, openai_model_name=_relocate(cmd.model_name, paths),
                       needs=needs, triton=triton, links={k: _relocate(v, paths) for k, v in cmd.links.items()},
                       copies={k: _relocate(v, paths) for k, v in cmd.copies.items()})


# The only expansions serve.sh makes: the variables that relocation put in. Everything else is literal.
_EXPANDED = re.compile(r"\$\{(" + "|".join((UNIT_DIR_VAR, CHECKPOINT_VAR, SERVE_CWD_VAR, "HOST", "PORT")) + r")\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def sh_word(arg: str) -> str:
    """One shell word for `arg`: `${EF_UNIT_DIR}`-style references stay expandable (in double quotes), every
    other character is single-quoted by shlex.quote, so `$(…)`, backticks, quotes, `;` and newlines are inert."""
    pieces, pos = [], 0
    for m in _EXPANDED.finditer(arg):
        if m.start() > pos:
            pieces.append(shlex.quote(arg[pos : m.start()]))
        pieces.append(f'"${{{m.group(1)}}}"')
        pos = m.end()
    if pos < len(arg) or not pieces:
        pieces.append(shlex.quote(arg[pos:]))
    return "".join(pieces)


def _comment(text: str) -> str:
    """Text for a `#` comment line: a newline in a value must not end the comment."""
    return _CONTROL.sub("?", text)


def serve_script(plan: ServingPlan) -> str:
    for name in [*plan.env, *plan.needs]:
        if not _ENV_NAME.match(name):
            raise ValueError(f"serve.sh: {name!r} is not an environment variable name")
    for name in plan.links:
        check_name(name, "serve.sh link name")
    for name in plan.copies:
        check_name(name, "serve.sh file name")
    checks = [f'if [ -z "${{{var}:-}}" ]; then printf \'%s\\n\' {shlex.quote(f"set {var}: {why}")} >&2; exit 2; fi'
              for var, why in plan.needs.items()]
    tool = plan.argv[0] if plan.argv else ""
    on_path: list[str]
    if tool and "/" not in tool and "$" not in tool:  # a command found on PATH: say which and how, if it is not
        missing = shlex.quote(f"serve.sh: {tool} is not on PATH: install it where you serve (the reference lane: "
                              "pip install transformers[serving]), or put the venv that has it first on PATH")
        on_path = [f"if ! command -v {shlex.quote(tool)} >/dev/null 2>&1; then printf '%s\\n' {missing} >&2; "
                   "exit 127; fi"]
    else:
        on_path = []
    env = " ".join(sh_word(f"{k}={v}") for k, v in plan.env.items())
    command = " ".join(sh_word(a) for a in plan.argv)
    lines = [
        "#!/bin/sh",
        _comment(f"# Serve {plan.model} unit {plan.unit} ({plan.lane} lane, key {plan.key[:12]}) on an "
                 "OpenAI-compatible"),
        _comment(f"# endpoint; health at {plan.health_path}; requests carry model={plan.openai_model_name}."),
        "set -eu",
        *checks,
        # Loopback unless HOST says otherwise (HOST=0.0.0.0 to serve other machines): an unauthenticated
        # endpoint is not exposed by default.
        'HOST="${HOST:-127.0.0.1}"',
        f'PORT="${{PORT:-{int(plan.default_port)}}}"',
        *_folder_lines(plan.links, plan.copies),
        *on_path,
        f'exec env {env} {command} "$@"' if env else f'exec {command} "$@"',
    ]
    return "\n".join(lines) + "\n"


def _folder_lines(links: dict[str, str], copies: dict[str, str]) -> list[str]:
    """The links and copies in a folder of this user's, made the working folder: one folder per set of targets
    (`$TMPDIR/ef-serve-<uid>/<cksum of the targets>`), reused by every start so nothing piles up in $TMPDIR, and
    refused unless this user owns it and it is not a symlink (another user cannot plant it). A copy is made afresh
    at each start, from the unit's own file (the server may have saved into the last one)."""
    if not links and not copies:
        return []
    targets = " ".join(sh_word(target) for target in [*links.values(), *copies.values()])
    refuse = shlex.quote("serve.sh: this is not a private folder of this user (remove it, or set TMPDIR): ")
    return ['EF_SERVE_ROOT="${TMPDIR:-/tmp}/ef-serve-$(id -u)"',
            'mkdir -p -m 700 "$EF_SERVE_ROOT"',
            'if [ -L "$EF_SERVE_ROOT" ] || [ ! -O "$EF_SERVE_ROOT" ]; then '
            f"printf '%s%s\\n' {refuse} \"$EF_SERVE_ROOT\" >&2; exit 2; fi",
            f"EF_SERVE_CWD=\"$EF_SERVE_ROOT/$(printf '%s\\n' {targets} | cksum | cut -d ' ' -f 1)\"",
            'mkdir -p "$EF_SERVE_CWD"',
            *(f'ln -sfn {sh_word(target)} "$EF_SERVE_CWD"/{shlex.quote(name)}' for name, target in links.items()),
            *(f'cp -f {sh_word(source)} "$EF_SERVE_CWD"/{shlex.quote(name)}' for name, source in copies.items()),
            'cd "$EF_SERVE_CWD"']


def write_serving_files(plan: ServingPlan, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    script = write_file_atomic(out / SERVE_SH, serve_script(plan).encode(), executable=True)
    config = write_file_atomic(out / SERVE_YAML, yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False).encode())
    return [script, config]
