"""The state dir of one stack: pid files, logs, the registry of ports, the S3 credentials."""

from __future__ import annotations

import json
import os
import secrets
import string
from dataclasses import dataclass
from pathlib import Path


class StackError(Exception):
    """A failure that is reported as one line (plus an optional log tail) and makes the command exit 1."""


@dataclass(frozen=True)
class State:
    root: Path

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def prepare(self) -> None:
        for sub in (self.pids, self.logs, self.root / "s3", self.root / "prefect", self.root / "hub"):
            sub.mkdir(parents=True, exist_ok=True)

    def read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_file(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def recorded_names(self) -> list[str]:
        return sorted(p.stem for p in self.pids.glob("*.pid")) if self.pids.is_dir() else []

    def load_registry(self) -> dict[str, dict[str, object]]:
        """Ports/URLs of the services ever started here, so `status` and `env` know them without flags."""
        try:
            return json.loads((self.root / "stack.json").read_text())
        except FileNotFoundError:
            return {}

    def save_registry(self, registry: dict[str, dict[str, object]]) -> None:
        write_private(self.root / "stack.json", json.dumps(registry, indent=2, sort_keys=True) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write atomically with 0600 perms: these files hold the S3 secret."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)  # O_CREAT's mode is ignored when the tmp file already existed
    os.replace(tmp, path)


def load_or_create_credentials(state: State) -> dict[str, str]:
    """The S3 admin pair; created once per state dir and reused, because weed's data outlives one `up`."""
    path = state.root / "credentials.env"
    if not path.exists():
        alphabet = string.ascii_letters + string.digits  # no symbols: safe unquoted in env files and URLs
        key = "EF" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(18))
        secret = "".join(secrets.choice(alphabet) for _ in range(40))
        write_private(path, f"AWS_ACCESS_KEY_ID={key}\nAWS_SECRET_ACCESS_KEY={secret}\n")
    os.chmod(path, 0o600)
    creds = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    if not creds.get("AWS_ACCESS_KEY_ID") or not creds.get("AWS_SECRET_ACCESS_KEY"):
        raise StackError(f"{path} lacks AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; delete it to regenerate")
    return {k: creds[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
