"""enginefoundry: checkpoints in, verified and benchmarked serving artifacts out.

This package is the domain: specs, lanes, stores, gates, tracking. It never imports Prefect;
`flows/` and `tasks/` compose it into a DAG.
"""

__version__ = "0.1.0"
