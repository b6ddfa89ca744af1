"""The local loopback stack of real services (run through scripts/stack.py): one module per service, and a
shared process supervisor.

    supervisor      detached process groups, pid files, markers, readiness waits with deadlines, clean stop
    state, net      the state dir (pids, logs, registry, credentials); loopback probes and ports
    s3              SeaweedFS (`weed mini`) with enforced credentials and the buckets
    postgres        PostgreSQL, the database of the Prefect and MLflow servers (a cluster in the state dir)
    mlflow_server   MLflow tracking server (backend store in PostgreSQL, artifacts in S3)
    prefect_server  Prefect server with UI (its database in PostgreSQL)
    hub             the tests' loopback Hugging Face hub
    workers         one Prefect process worker per pool
    envfiles        <state>/env and <state>/env.json for clients
    commands        up / down / status

Only the standard library and boto3 (imported lazily, for the buckets) are used.
"""
