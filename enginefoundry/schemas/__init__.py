"""The documents enginefoundry persists or exchanges, typed, in one home (issue 35).

Every document that leaves a process (the manifest and its parts, bundle info, leases, the attestation index, the
toolchain channel, pending records, reference sets, search results) is a pydantic model in this package with its
`schema_version`, and its JSON Schema is generated beside it (`*.schema.json`; a unit test keeps them equal). Readers
decide on fields, never on strings looked up in a dict. `loose` names the few loose types that remain (a third
party's free-form JSON), so that they can be counted.

`db/` holds the recorded database schemas of the MLflow and Prefect releases in use (records/db_templates.py).
"""
