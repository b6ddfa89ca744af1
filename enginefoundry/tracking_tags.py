"""Every MLflow tag name this project writes or reads, in one place (as MLflow's own mlflow/utils/mlflow_tags.py
does for `mlflow.*`). Project tags live in the `enginefoundry.` namespace only; MLflow's standard context tags
(`mlflow.user`, `mlflow.source.*`) are MLflow's names, re-exported here so no module spells a tag by hand.

Where they go: runs (parent and unit), model versions (what an auditor reads from an alias in one hop) and the
registered model (champion history).
"""

from __future__ import annotations

NAMESPACE = "enginefoundry."

# MLflow's standard context tags (mlflow/utils/mlflow_tags.py@v3.17.2: MLFLOW_USER, MLFLOW_SOURCE_NAME,
# MLFLOW_SOURCE_TYPE, MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID).
MLFLOW_USER = "mlflow.user"
MLFLOW_SOURCE_NAME = "mlflow.source.name"
MLFLOW_SOURCE_TYPE = "mlflow.source.type"
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"

# Runs
SPEC = "enginefoundry.spec"
# A fleet (enginefoundry/rollout/fleet.py): its run carries FLEET; each member spec's build run names the fleet's run.
FLEET = "enginefoundry.fleet"
FLEET_RUN_ID = "enginefoundry.fleet_run_id"
LANE = "enginefoundry.lane"
GIT_COMMIT = "enginefoundry.git_commit"  # this project's commit (also as mlflow.source.git.commit)
SOURCE_URI = "enginefoundry.source_uri"
SOURCE_REVISION = "enginefoundry.source_revision"
WEIGHTS_DIGEST = "enginefoundry.weights_digest"
TOKENIZER_DIGEST = "enginefoundry.tokenizer_digest"
# A unit of a LoRA adapter (model.adapters, merge mode): the base's weights digest (WEIGHTS_DIGEST is the merged
# checkpoint's, derived from both) and the adapter's name, source, revision and digest.
BASE_WEIGHTS_DIGEST = "enginefoundry.base_weights_digest"
ADAPTER = "enginefoundry.adapter"
ADAPTER_URI = "enginefoundry.adapter_uri"
ADAPTER_REVISION = "enginefoundry.adapter_revision"
ADAPTER_DIGEST = "enginefoundry.adapter_digest"
PROMPTS_DIGEST = "enginefoundry.prompts_digest"
# A rollout's build (its parent run): why the rollout built (each changed target's reason: a new commit, an adapter's
# new revision, a toolchain bump) and the adapters whose new revision triggered it (comma-separated; issue 36).
ROLLOUT_TRIGGER = "enginefoundry.rollout_trigger"
ROLLOUT_ADAPTERS = "enginefoundry.rollout_adapters"
PREFECT_FLOW_RUN_ID = "enginefoundry.prefect_flow_run_id"
PREFECT_FLOW_RUN_URL = "enginefoundry.prefect_flow_run_url"
KEY = "enginefoundry.key"
TARGET = "enginefoundry.target"
ARCH = "enginefoundry.arch"
WORK_POOL = "enginefoundry.work_pool"
CACHE_HIT = "enginefoundry.cache_hit"
BUILT_BY_RUN = "enginefoundry.built_by_run"
MANIFEST_URI = "enginefoundry.manifest_uri"
MANIFEST_SHA256 = "enginefoundry.manifest_sha256"  # sha256 of the manifest's bytes: verify/pull/rollback check it
STATUS = "enginefoundry.status"
STATUS_REASON = "enginefoundry.status_reason"
GPU = "enginefoundry.gpu"
FAST_PATH = "enginefoundry.fast_path"  # "true" on a parent run that the all-hits fast path recorded
REGISTRY_REPAIRED = "enginefoundry.registry_repaired"  # on a hit's run: the registration or alias it restored

# Model versions: the above where they apply, plus what an auditor asks first
VERSION_PREFIX = "enginefoundry.version."  # + tool name: toolchain versions (tensorrt_llm, torch, …)
TOOLCHAIN_IMAGE = "enginefoundry.toolchain_image"
GATE_VERDICT = "enginefoundry.gate_verdict"
SMOKE_AGREEMENT = "enginefoundry.smoke_agreement"
BEST_OUTPUT_TPS = "enginefoundry.best_output_tokens_per_s"  # enginefoundry.records.run_summary.best_throughput
BEST_AT = "enginefoundry.best_output_tokens_per_s_at"  # "<scenario> c=<concurrency>"
RUN_URL = "enginefoundry.run_url"
ALIAS_STEM = "enginefoundry.alias_stem"
DEPLOYABLE = "enginefoundry.deployable"  # "false" on a version whose unit its gates rejected
SERVING_URI = "enginefoundry.serving_uri"
PROMOTED_AT = "enginefoundry.promoted_at"
PROMOTION_REASON = "enginefoundry.promotion_reason"
PREVIOUS_CHAMPION = "enginefoundry.previous_champion"
SUPERSEDED_BY = "enginefoundry.superseded_by"
COMMANDS = "enginefoundry.commands"  # the exact commands a unit ran, one `stage: command` line each
ROLLED_BACK_AT = "enginefoundry.rolled_back_at"

# Registered model
CHAMPION_HISTORY = "enginefoundry.champions.{stem}"  # comma-separated champion versions of one alias stem


def version_tag(tool: str) -> str:
    return f"{VERSION_PREFIX}{tool}"

# The smoke gate: which reference answers and which policy judged a unit.
SMOKE_REFERENCE_KEY = "enginefoundry.smoke_reference_key"
SMOKE_REFERENCE = "enginefoundry.smoke_reference"
SMOKE_POLICY = "enginefoundry.smoke_policy"
SMOKE_NOT_RUN = "enginefoundry.smoke_not_run"  # the gate's checks that could not run, and why ("none": every one ran)
SMOKE_REFERENCE_WHY = "enginefoundry.smoke_reference_why"  # why that reference, and which bounds (like with like?)
SMOKE_SERVER = "enginefoundry.smoke_server"  # the server the smoke stage judged ("enginefoundry scoring server", …)

# Runs that a run of this host started and that never ended (kill -9): who owned them, and why they ended.
OWNER_HOST = "enginefoundry.host"
OWNER_PID = "enginefoundry.pid"
OWNER_PID_START = "enginefoundry.pid_start"
END_REASON = "enginefoundry.end_reason"

# One lineage per alias (enginefoundry.records.alias_lineage): on every registered version.
LINEAGE = "enginefoundry.lineage"  # digest of the unit's identity apart from what a rollout may change
LINEAGE_LABEL = "enginefoundry.lineage_label"  # "spec tiny-cpu: fp32-tp1.chat.cpu (reference lane)"
