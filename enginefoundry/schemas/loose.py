"""The loose types that remain, each named for the outside document it is (issue 35).

A document enginefoundry writes or reads as its own is a model in `enginefoundry.schemas`, never one of these. An
alias here is for JSON whose shape belongs to someone else (a model's config.json, a Prefect or MLflow payload, a JSON
Schema), passed through or read with bounds. tests/unit/test_loose_budget.py counts `dict[str, Any]`, bare `Any` and
these aliases per package against a budget that only goes down.

Add an alias when a new kind of outside JSON comes in; say in its docstring whose document it is.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object from outside with no narrower name below (read field by field, with bounds)."""

JsonSchemaDocument: TypeAlias = dict[str, Any]
"""A JSON Schema document (draft 2020-12), as pydantic generates it and jsonschema reads it."""

PrefectJobVariables: TypeAlias = dict[str, Any]
"""Job variables of a Prefect deployment or flow run (the work pool's base job template decides their shape)."""

HfModelConfig: TypeAlias = dict[str, Any]
"""A Hugging Face model's config.json (or a ModelOpt hf_quant_config.json): the model's authors decide its keys."""

TrtllmConfig: TypeAlias = dict[str, Any]
"""A TensorRT-LLM document: the LLM API YAML (`--extra_llm_api_options`, `trtllm-serve --config`, the disaggregated
router's `-c` YAML), or a checkpoint's or engine's config.json. The release decides its keys; lanes/trtllm_flags.py
checks the LLM API keys against the release's surface."""

InTotoStatement: TypeAlias = dict[str, Any]
"""An in-toto Statement (v1), one of its predicates or a part of one (SLSA provenance v1, in-toto test-result v0.1,
enginefoundry's benchmark predicate, which carries the manifest's benchmark): the in-toto and SLSA specs decide the
envelope's shape, the predicate type the rest."""

SigstoreBundle: TypeAlias = dict[str, Any]
"""A Sigstore bundle (v0.3) or a part of one (verificationMaterial): the Sigstore protobuf specs decide its shape."""

AiperfExport: TypeAlias = dict[str, Any]
"""A benchmark tool's profile export (AIPerf's profile_export_aiperf.json, genai-perf's profile_export_genai_perf.json):
the tool's release decides its keys."""

MlflowPayload: TypeAlias = dict[str, Any]  # JSON edge: MLflow params and tags
"""An MLflow run's params or tags as handed to the tracking client (nested values are flattened to `a.b` keys and
strings by records/tracking.py); MLflow decides what a value may be."""
