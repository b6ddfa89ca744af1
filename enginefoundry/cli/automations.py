"""`automations create`: install automations.yaml on the Prefect server (PREFECT_API_URL), with the
notification block filled in. Automations of the same name are replaced, so running it twice is harmless."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from enginefoundry.cli.common import emit_json, wants_json
from enginefoundry.console import console
from enginefoundry.errors import EXIT_OK, InputError
from enginefoundry.schemas.loose import JsonObject

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "automations.yaml"
PLACEHOLDER = "NOTIFY_BLOCK_ID"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    auto = sub.add_parser("automations", help="install the Prefect automations (notify on a rejected unit or a "
                                              "failed build) on the server of $PREFECT_API_URL")
    auto.add_argument("action", choices=("create",))
    auto.add_argument("--notify", required=True, metavar="BLOCK",
                      help="notification block as <block-type-slug>/<block-name>, e.g. slack-webhook/ops")
    auto.add_argument("--file", default=str(DEFAULT_FILE), help="automations file (default: automations.yaml)")
    auto.set_defaults(handler=cmd_automations)


def load_automations(path: Path) -> list[JsonObject]:
    if not path.is_file():
        raise InputError(f"--file: {path} does not exist")
    data = yaml.safe_load(path.read_text())
    items = data.get("automations", data) if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise InputError(f"{path}: expected `automations:` with a list of automations")
    return items


def cmd_automations(args: argparse.Namespace) -> int:
    from enginefoundry.flows.automations import create_automations

    items = load_automations(Path(args.file))
    ids = create_automations(items, args.notify, PLACEHOLDER)
    if wants_json(args):
        emit_json({"created": [{"name": i["name"], "id": a} for i, a in zip(items, ids, strict=True)]})
        return EXIT_OK
    for item, automation_id in zip(items, ids, strict=True):
        console.print(f"automation {item['name']}: {automation_id}", markup=False)
    return EXIT_OK
