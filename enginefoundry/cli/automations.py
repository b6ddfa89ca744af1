"""`automations create`: install automations.yaml on the Prefect server (PREFECT_API_URL), with the
notification block filled in. Automations of the same name are replaced, so running it twice is harmless."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from enginefoundry.cli.common import emit_json, wants_json
from enginefoundry.console import console
from enginefoundry.errors import EXIT_OK, InputError

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "automations.yaml"
PLACEHOLDER = "NOTIFY_BLOCK_ID"


def register(sub: argparse._SubParsersAction) -> None:
    auto = sub.add_parser("automations", help="install the Prefect automations (notify on a rejected unit or a "
                                              "failed build) on the server of $PREFECT_API_URL")
    auto.add_argument("action", choices=("create",))
    auto.add_argument("--notify", required=True, metavar="BLOCK",
                      help="notification block as <block-type-slug>/<block-name>, e.g. slack-webhook/ops")
    auto.add_argument("--file", default=str(DEFAULT_FILE), help="automations file (default: automations.yaml)")
    auto.set_defaults(handler=cmd_automations)


def load_automations(path: Path) -> list[dict[str, Any]]:
    import yaml

    if not path.is_file():
        raise InputError(f"--file: {path} does not exist")
    data = yaml.safe_load(path.read_text())
    items = data.get("automations", data) if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise InputError(f"{path}: expected `automations:` with a list of automations")
    return items


def create_automations(items: list[dict[str, Any]], block_slug: str) -> list[str]:
    """Resolve the block, replace automations of the same names; returns the created automation ids."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.asyncutils import run_coro_as_sync

    block_type, _, block_name = block_slug.partition("/")
    if not block_type or not block_name:
        raise InputError(f"--notify {block_slug!r}: give <block-type-slug>/<block-name>, e.g. slack-webhook/ops")

    async def run() -> list[str]:
        async with get_client() as client:
            try:
                block = await client.read_block_document_by_name(block_name, block_type)
            except ObjectNotFound:
                raise InputError(f"--notify: no block {block_slug} on {client.api_url}; create it "
                                 f"(`prefect block create {block_type}`) or pick one of `prefect block ls`") from None
            created = []
            for item in items:
                for action in item.get("actions", []):
                    if action.get("block_document_id") == PLACEHOLDER:
                        action["block_document_id"] = str(block.id)
                automation = AutomationCore.model_validate(item)
                for old in await client.read_automations_by_name(automation.name):
                    await client.delete_automation(old.id)
                created.append(str(await client.create_automation(automation)))
            return created

    return run_coro_as_sync(run()) or []


def cmd_automations(args: argparse.Namespace) -> int:
    items = load_automations(Path(args.file))
    ids = create_automations(items, args.notify)
    if wants_json(args):
        emit_json({"created": [{"name": i["name"], "id": a} for i, a in zip(items, ids, strict=True)]})
        return EXIT_OK
    for item, automation_id in zip(items, ids, strict=True):
        console.print(f"automation {item['name']}: {automation_id}", markup=False)
    return EXIT_OK
