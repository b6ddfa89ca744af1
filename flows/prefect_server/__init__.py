"""Prefect's temporary API server as the CLI runs it: started early, adopted by Prefect, dying with the CLI.

Not a flow, and not the domain: this package may import Prefect (its private internals only in
`_prefect_private.py`, version-gated), and only the entry layer (cli/) imports it. `ephemeral.py` starts and adopts
the server, `ephemeral_server.py` is its process (`python -m enginefoundry.flows.prefect_server.ephemeral_server`).
"""

from __future__ import annotations

from enginefoundry.flows.prefect_server.ephemeral import EarlyServer, guard_ephemeral_prefect_server, start_early_server

__all__ = ["EarlyServer", "guard_ephemeral_prefect_server", "start_early_server"]
