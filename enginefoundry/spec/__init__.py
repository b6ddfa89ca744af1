"""The build spec, split by concern: source, matrix (variants/profiles/targets), checks, outputs."""

from enginefoundry.spec.build_spec import BuildSpec, ToolchainSpec, load_spec, parse_spec
from enginefoundry.spec.checks import (
    BenchmarkSpec,
    BenchTool,
    ReferenceDevice,
    ReferenceSource,
    Scenario,
    SLOs,
    SmokeSpec,
)
from enginefoundry.spec.matrix import Arch, CalibrationSpec, KVCacheDtype, Precision, Profile, Target, Variant
from enginefoundry.spec.outputs import PublishSpec, TrackingSpec
from enginefoundry.spec.search import Objective, SearchedUnit, SearchSpec
from enginefoundry.spec.source import AdapterMode, AdapterSpec, ModelSpec, SourceKind, SourceURI, parse_source_uri
from enginefoundry.spec.speculative import SpecAlgorithm, SpeculativeSpec

__all__ = [
    "AdapterMode", "AdapterSpec", "Arch", "BenchTool", "BenchmarkSpec", "BuildSpec", "CalibrationSpec", "KVCacheDtype",
    "ModelSpec", "Objective", "Precision", "Profile", "PublishSpec",
    "ReferenceDevice", "ReferenceSource", "SLOs", "Scenario", "SearchSpec", "SearchedUnit", "SmokeSpec", "SourceKind",
    "SourceURI", "SpecAlgorithm", "SpeculativeSpec", "Target", "ToolchainSpec", "TrackingSpec", "Variant", "load_spec",
    "parse_source_uri", "parse_spec",
]
