"""PostgreSQL, where the stack's Prefect server and MLflow server keep their state (issue 40).

A cluster of its own in <state>/postgres, made by `initdb` on the first `up` (into <state>/postgres.init, renamed
once complete, so an initdb cut short leaves nothing a later `up` trips over), listening on 127.0.0.1 only (no
unix socket), on a free port kept per state dir. Password authentication (scram-sha-256) for every connection:
a superuser `ef` for the stack itself, and one login role per server owning its database (`prefect`, `mlflow`),
with passwords generated once and kept in <state>/postgres.env (0600). The servers get their URL through the
environment, never on a command line. Each server migrates its own database when it starts (Prefect:
PREFECT_SERVER_DATABASE_MIGRATE_ON_START, default on; MLflow: SqlAlchemyStore creates the schema of an empty
database; after an MLflow upgrade the stack runs `mlflow db upgrade` first, mlflow_server.py).

The server runs in the foreground (`postgres -D`, not `pg_ctl`), so it is a process group of the supervisor like
every other service: `down` sends INT (PostgreSQL's fast shutdown: clients disconnected, a checkpoint), then
QUIT (immediate shutdown), then KILL. A `kill -9` of the stack leaves postmaster.pid behind: PostgreSQL itself
ignores one whose PID is gone, but refuses one whose PID is alive, which a recycled PID or an unreaped zombie is;
`up` removes it when that PID is no server of this data directory.

PostgreSQL refuses to run as root ("root" execution of the PostgreSQL server is not permitted: src/backend/main/
main.c, check_root). Run by root (CI, this machine), initdb and postgres run in a user namespace where root is
mapped to the `postgres` user of Debian's package (`unshare --user --map-user`, util-linux): the files stay root's
outside, in the stack's folder, and the processes stay in the supervisor's process group.

Binaries: EF_POSTGRES_BIN (a folder holding initdb, postgres, pg_isready, psql), else the folder of `initdb` on
PATH, else the newest /usr/lib/postgresql/<major>/bin (Debian's `postgresql` package puts them there and not on
PATH). A data directory made by another major release is refused with the fix.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import string
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stacklib.net import HOST
from stacklib.state import StackError, State, write_private
from stacklib.supervisor import Context, Outcome, child_env, launch, owned_members, wait_until

ADMIN = "ef"  # the superuser initdb makes; only the stack itself logs in with it
DATABASES = ("prefect", "mlflow")  # one database each, owned by a login role of the same name
BINARIES = ("initdb", "postgres", "pg_isready", "psql")
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
# Debian's package makes this user; root runs PostgreSQL mapped to it (any non-root uid would do, one that has a
# name keeps getpwuid() answering inside the namespace). Without it: nobody.
UNPRIVILEGED_USERS = ("postgres", "nobody")
INSTALL_HINT = ("install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; the stack needs only its binaries, "
                "no service) or set EF_POSTGRES_BIN to the folder of its initdb and postgres")


@dataclass(frozen=True)
class Cluster:
    """Where one state dir's PostgreSQL lives and how to log in."""

    data: Path
    port: int
    passwords: dict[str, str]  # role → password: ADMIN and every DATABASES role

    def url(self, role: str, driver: str = "postgresql") -> str:
        """A SQLAlchemy URL for `role` on its database (the admin's: the `postgres` database)."""
        database = role if role in DATABASES else "postgres"
        return f"{driver}://{role}:{self.passwords[role]}@{HOST}:{self.port}/{database}"


def data_dir(state: State) -> Path:
    return state.root / "postgres"


def password_file(state: State) -> Path:
    return state.root / "postgres.env"


def cluster(state: State, port: int) -> Cluster:
    return Cluster(data_dir(state), port, load_passwords(state, create=False))


def load_passwords(state: State, create: bool) -> dict[str, str]:
    """The passwords of ADMIN and the server roles, made once per state dir (with the cluster) and reused."""
    path = password_file(state)
    roles = (ADMIN, *DATABASES)
    if create and not path.exists():
        alphabet = string.ascii_letters + string.digits  # no symbols: safe in URLs, SQL literals and env files
        lines = [f"{role}={''.join(secrets.choice(alphabet) for _ in range(32))}" for role in roles]
        write_private(path, "\n".join(lines) + "\n")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise StackError(
            f"postgres: {path} is missing, so nothing can log in to {data_dir(state)}; remove that folder to start "
            "a new, empty database (the Prefect and MLflow state in it is lost)"
        ) from None
    found = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    bad = [r for r in roles if not re.fullmatch(r"[A-Za-z0-9]{16,128}", found.get(r, ""))]
    if bad:
        raise StackError(f"postgres: {path} lacks a valid password for {', '.join(bad)}")
    return {role: found[role] for role in roles}


def bin_dir(wanted_major: str | None = None) -> Path:
    """The folder of PostgreSQL's server binaries; with `wanted_major` (a data directory's PG_VERSION), the first
    folder of that release if there is one (else the first found, and the caller refuses the mismatch)."""
    override = os.environ.get("EF_POSTGRES_BIN", "")
    candidates: list[Path] = []
    if override:
        candidates = [Path(override)]
    else:
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).resolve().parent)
        candidates += sorted(Path("/").glob(DEBIAN_BIN_GLOB.lstrip("/")), key=_major_of_folder, reverse=True)
    found = [folder for folder in candidates if all(os.access(folder / name, os.X_OK) for name in BINARIES)]
    if not found:
        where = f"EF_POSTGRES_BIN={override}" if override else f"PATH and {DEBIAN_BIN_GLOB}"
        raise StackError(f"postgres: no initdb/postgres/pg_isready/psql found ({where}); {INSTALL_HINT}")
    if wanted_major:
        return next((folder for folder in found if server_major(folder) == wanted_major), found[0])
    return found[0]


def _major_of_folder(folder: Path) -> int:
    name = folder.parent.name
    return int(name) if name.isdigit() else 0


def server_major(bins: Path) -> str:
    out = subprocess.run([str(bins / "postgres"), "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"\(PostgreSQL\) (\d+)", out)
    if not found:
        raise StackError(f"postgres: cannot tell the release of {bins / 'postgres'} from {out.strip()!r}")
    return found.group(1)


def as_unprivileged(argv: list[str]) -> list[str]:
    """`argv` as it must run: unchanged for a normal user; for root, in a user namespace where root is mapped to
    an unprivileged user (see the module's docstring)."""
    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    if unshare is None:
        raise StackError("postgres: PostgreSQL refuses to run as root and `unshare` (util-linux) is missing to run it "
                         "as another user; run the stack as a non-root user")
    for name in UNPRIVILEGED_USERS:
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        return [unshare, "--user", f"--map-user={user.pw_uid}", f"--map-group={user.pw_gid}", *argv]
    raise StackError(f"postgres: none of the users {', '.join(UNPRIVILEGED_USERS)} exists to run PostgreSQL as")


def initialise(ctx: Context, bins: Path) -> None:
    """initdb into a temporary folder, renamed into place once complete."""
    state = ctx.state
    data = data_dir(state)
    scratch = state.root / "postgres.init"
    shutil.rmtree(scratch, ignore_errors=True)  # what an initdb cut short left
    passwords = load_passwords(state, create=True)
    pwfile = state.root / "postgres.init.pw"
    write_private(pwfile, passwords[ADMIN] + "\n")
    argv = as_unprivileged([str(bins / "initdb"), "--pgdata", str(scratch), "--username", ADMIN,
                            "--pwfile", str(pwfile), "--auth", "scram-sha-256", "--encoding", "UTF8",
                            "--no-locale", "--no-instructions"])
    try:
        done = subprocess.run(argv, env=child_env(state, {}), cwd=state.root, capture_output=True, text=True,
                              timeout=300)
    finally:
        pwfile.unlink(missing_ok=True)
    with state.log_file("postgres").open("a") as log:
        log.write(f"\n=== initdb -> rc {done.returncode}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        hint = (" (run by root, it runs through `unshare --user --map-user`, which needs util-linux 2.38 or later "
                "and a kernel that allows user namespaces; or run the stack as a non-root user)"
                if "unshare" in done.stderr else "")
        raise StackError(f"postgres: initdb failed (rc {done.returncode}){hint}:\n{done.stderr.strip()[-2000:]}")
    os.replace(scratch, data)


def stop_orphans(state: State) -> list[int]:
    """KILL what is left of a server of the stack's data directory whose postmaster is gone, and wait for it to go.

    PostgreSQL's children leave the postmaster's process group (InitPostmasterChild calls setsid()), so a signal to
    the group reaches the postmaster alone. Stopped by `down`, the postmaster ends its children before it exits;
    killed (-9), its children exit once they notice, but a backend busy in a query does not, and it keeps the
    shared memory that makes the next start refuse ("pre-existing shared memory block is still in use"). Found by
    their program (postgres) and working folder (the data directory); not by the stack's marker, which a child
    overwrites with its process title (ps_status.c). A live postmaster named by postmaster.pid is no orphan: left
    alone (clear_stale_lock refuses to start beside it)."""
    data = data_dir(state)
    postmaster = _lock_pid(data)
    if postmaster and _serves(postmaster, data):
        return []
    orphans = [pid for pid in _pids() if _serves(pid, data)]
    for pid in orphans:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if not wait_until(lambda: not any(_serves(pid, data) for pid in orphans), 10.0):
        raise StackError(f"postgres: processes {orphans} on {data} are still alive after SIGKILL")
    return orphans


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _lock_pid(data: Path) -> int:
    """The PID postmaster.pid names (0 when there is none)."""
    try:
        first = (data / "postmaster.pid").read_text().splitlines()[0].strip()
    except (FileNotFoundError, IndexError):
        return 0
    return abs(int(first)) if first.lstrip("-").isdigit() else 0  # single-user mode writes -PID


def clear_stale_lock(state: State) -> None:
    """Before a start while no server of ours runs: end the orphans of a killed one, and remove postmaster.pid
    when the PID it names is no server of the data directory (PostgreSQL refuses to start while that PID is
    alive: a recycled PID or an unreaped zombie)."""
    data = data_dir(state)
    pid = _lock_pid(data)
    if pid and _serves(pid, data):
        raise StackError(
            f"postgres: a server this stack did not start (pid {pid}) runs on {data}; stop it (kill -INT {pid}) "
            "and run `up` again"
        )
    stop_orphans(state)
    (data / "postmaster.pid").unlink(missing_ok=True)


def _serves(pid: int, data: Path) -> bool:
    """True when `pid` is a live (not zombie) PostgreSQL process whose working folder is `data`: the postmaster
    and every child chdir into their data directory."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        program = Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:  # gone, or not ours to read
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X") and cwd == data.resolve() and program == "postgres"


def psql(bins: Path, db: Cluster, sql: str, database: str = "postgres", timeout_s: float = 60) -> str:
    """Run `sql` (from stdin, so no password or statement shows on a command line) as the admin; its output."""
    env = {**child_env_base(), "PGPASSWORD": db.passwords[ADMIN], "PGCONNECT_TIMEOUT": "10"}
    argv = [str(bins / "psql"), "--no-psqlrc", "--quiet", "--no-align", "--tuples-only", "--set", "ON_ERROR_STOP=1",
            "--host", HOST, "--port", str(db.port), "--username", ADMIN, "--dbname", database, "--file", "-"]
    done = subprocess.run(argv, input=sql, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise StackError(f"postgres: psql failed (rc {done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def child_env_base() -> dict[str, str]:
    """psql's environment: ours without any PG* setting from the caller's shell (PGSERVICE, PGSSLMODE, ...)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def setup_sql(db: Cluster) -> str:
    """Idempotent: each server's role (its password from postgres.env) and database."""
    lines = []
    for name in DATABASES:
        lines += [
            f"SELECT 'CREATE ROLE {name} LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}')"
            r" \gexec",
            f"ALTER ROLE {name} WITH LOGIN PASSWORD '{db.passwords[name]}';",
            f"SELECT 'CREATE DATABASE {name} OWNER {name}' "
            f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{name}')" r" \gexec",
        ]
    return "\n".join(lines) + "\n"


def pg_isready(bins: Path, port: int) -> bool:
    argv = [str(bins / "pg_isready"), "--quiet", "--host", HOST, "--port", str(port), "--timeout", "2"]
    try:
        return subprocess.run(argv, env=child_env_base(), timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def start_postgres(ctx: Context) -> Outcome:
    state = ctx.state
    data = data_dir(state)
    port = ctx.ports["postgres"]
    version_file = data / "PG_VERSION"
    made_by = version_file.read_text().strip() if version_file.exists() else None
    bins = bin_dir(made_by)
    if made_by is None:
        initialise(ctx, bins)
    elif made_by != server_major(bins):
        raise StackError(
            f"postgres: {data} was made by PostgreSQL {made_by} and this machine runs {server_major(bins)} "
            f"({bins}); install PostgreSQL {made_by}, or remove {data} to start a new, empty database"
        )
    db = cluster(state, port)
    if not owned_members(state, state.read_pid("postgres")):
        clear_stale_lock(state)
    # Settings on the command line, so each `up` applies them whatever postgresql.conf says: loopback TCP only (no
    # unix socket: Debian's default folder, /var/run/postgresql, is the system's), logs to stderr (the service log).
    argv = as_unprivileged([str(bins / "postgres"), "-D", str(data), "-p", str(port),
                            "-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=",
                            "-c", "logging_collector=off", "-c", "log_destination=stderr"])
    env = child_env(state, {})
    outcome = launch(ctx, "postgres", lambda: argv, env, lambda: pg_isready(bins, port))
    psql(bins, db, setup_sql(db))
    # Prefect's migrations create pg_trgm (trusted since PostgreSQL 13, so its database's owner may); made here by
    # the superuser too, as Prefect's docs ask of a managed server ("Prefect uses the pg_trgm extension, so it must
    # be installed and enabled": https://docs.prefect.io/v3/concepts/server).
    psql(bins, db, "CREATE EXTENSION IF NOT EXISTS pg_trgm;\n", database="prefect")
    outcome.url = f"postgresql://{HOST}:{port}"
    return outcome


def describe(state: State, port: int) -> str:
    """One line for `status`: the server's release and each database's size."""
    try:
        bins = bin_dir()
        db = cluster(state, port)
        sizes = psql(bins, db, "SELECT current_setting('server_version'); SELECT datname || ' ' || "
                     "pg_size_pretty(pg_database_size(datname)) FROM pg_database WHERE datname IN "
                     f"({', '.join(repr(d) for d in DATABASES)}) ORDER BY datname;", timeout_s=15).split("\n")
    except (StackError, subprocess.TimeoutExpired, OSError) as err:
        return f"(no answer: {str(err).splitlines()[0][:200]})"
    version, *rows = [line for line in sizes if line.strip()]
    return f"PostgreSQL {version}; " + ", ".join(rows) + f"; data {data_dir(state)}"

