"""Install automations on the Prefect server (the `automations create` command's Prefect side)."""

from __future__ import annotations

from typing import Any

from enginefoundry.errors import InputError


def create_automations(items: list[dict[str, Any]],  # JSON edge: automations.yaml entries
                       block_slug: str, placeholder: str) -> list[str]:
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
                    if action.get("block_document_id") == placeholder:
                        action["block_document_id"] = str(block.id)
                automation = AutomationCore.model_validate(item)
                for old in await client.read_automations_by_name(automation.name):
                    await client.delete_automation(old.id)
                created.append(str(await client.create_automation(automation)))
            return created

    return run_coro_as_sync(run()) or []
