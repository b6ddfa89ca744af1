#!/usr/bin/env python3
"""Start, stop and inspect a local loopback stack of real services for tests, CI and the cluster-mode demo.

    python scripts/stack.py up [--state-dir .stack] [--services s3,postgres,mlflow,prefect,hub] [--worker-pools cpu]
    python scripts/stack.py down [--state-dir .stack]
    python scripts/stack.py status [--state-dir .stack]

Services: SeaweedFS (`weed mini`) as S3, PostgreSQL (the database of the next two; it comes up with either), an
MLflow server with its artifacts in S3, a Prefect server (with UI) plus one process worker per pool, and the test
Hugging Face hub (tests/services/hub_server.py). All bind to 127.0.0.1. Each service runs detached in its own
process group, logs to <state>/logs/<name>.log and has its PID in <state>/pids/<name>.pid. `up` writes
<state>/env (sourceable) and <state>/env.json for clients.

Run it with the project's venv python: the service binaries are looked up next to that interpreter.
The code lives in scripts/stacklib/ (one module per service, a shared process supervisor).
"""

from __future__ import annotations

import sys

from stacklib.commands import main  # scripts/ is on sys.path when this file runs as a script

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
