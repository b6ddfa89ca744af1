"""Prefect tasks: one module per stage. Each task is a thin wrapper over enginefoundry/ domain code and
the unit of retry and observability in the Prefect UI. Large artifacts never travel as task results:
only paths, URIs and digests do."""
