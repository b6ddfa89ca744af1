"""`enginefoundry leases`: the build leases in a store (who holds each, whether its process is alive, when
it expires), and `--break KEY` to clear one by hand."""

from __future__ import annotations

import argparse

from enginefoundry.cli.common import destination_flags, emit_json, load, wants_json
from enginefoundry.console import console, table
from enginefoundry.errors import EXIT_OK, InputError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("leases", help="list the build leases of a store; --break KEY clears one")
    cmd.add_argument("spec", nargs="?", help="build spec YAML whose publish.store to read (or give --store)")
    destination_flags(cmd, mlflow=False)
    cmd.add_argument("--break", dest="break_key", metavar="KEY",
                     help="clear this lease: its store key, or the whole unit key it guards (as `leases` lists it)")
    cmd.add_argument("--force", action="store_true",
                     help="with --break: clear it even when its holder is alive (that run is told it was broken)")
    cmd.set_defaults(handler=cmd_leases)


def cmd_leases(args: argparse.Namespace) -> int:
    from enginefoundry.store.backends import open_store
    from enginefoundry.store.lease import break_lease, list_leases

    if args.spec:
        spec, _ = load(args.spec, args)  # --store and --s3-endpoint-url outrank the spec (settings)
        store = open_store(spec.publish.store, spec.publish.s3_endpoint_url)
    elif args.store:
        store = open_store(args.store, getattr(args, "s3_endpoint_url", None))
    else:
        raise InputError("give a build spec or --store URI")
    if args.break_key:
        if not break_lease(store, args.break_key, force=args.force):
            raise InputError(f"no lease matches '{args.break_key}' in {store.uri}")
        console.print(f"cleared the lease {args.break_key} in {store.uri}", markup=False)
        return EXIT_OK
    rows = list_leases(store)
    if wants_json(args):
        emit_json(rows)
        return EXIT_OK
    table(f"build leases in {store.uri}", [
        {"key": r.key, "owner": r.owner, "host": r.host, "pid": str(r.pid), "age": f"{r.age_s:.0f} s",
         "expires": f"in {r.expires_in_s:.0f} s" if r.expires_in_s >= 0 else f"{-r.expires_in_s:.0f} s ago",
         "alive": r.alive, "stale": "yes" if r.stale else "no"} for r in rows])
    return EXIT_OK
