"""Everything that can be checked before any download or GPU time, reported at once.

`validate_deep` (used by the flows) checks a parsed spec's lane options and input files. `validate_file`
(the `validate` command) goes further in one pass: the spec's fields, its input files (even when fields are
invalid), a local model source, the registered-model name, and every unit's preflight verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from enginefoundry.errors import InputError, SourceError, SpecError
from enginefoundry.inputs.quantized_source import spec_quantization_problems
from enginefoundry.lanes import get_lane
from enginefoundry.planning.preflight import reference_problems
from enginefoundry.smoke import check_prompt_count, load_prompt_set
from enginefoundry.smoke.policy import policy_for
from enginefoundry.spec import BuildSpec, SourceKind, load_spec

# MLflow refuses registered-model names with '/' (models:/<name>/<version> URIs) and ':' .
_BAD_MODEL_NAME = re.compile(r"[/:%]")


def validate_deep(spec: BuildSpec) -> None:
    """Lane options (removed flags …), input files. Raises SpecError listing every problem."""
    problems = _deep_problems(spec)
    if problems:
        raise SpecError(problems, spec.name)


def _deep_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    problems = list(get_lane(spec.lane).validate_options(spec))
    # A pre-quantized source (read from its files where they are here: a local source, the Hub cache) that a variant
    # contradicts; a source not here yet is checked by the fetch, before its weights come.
    problems += spec_quantization_problems(spec)
    problems += _prompt_problems(spec)
    problems += _signature_problems(spec)
    problems += _prices_problems(spec)
    problems += [(field, message) for field, message, _ in reference_problems(spec)]
    problems += _adapter_problems(spec)
    return problems


def _adapter_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """model.adapters checked from each adapter_config.json alone (enginefoundry/inputs/adapters.py), before any
    download of weights: the base it names, its target modules, its rank, the base's precision."""
    if not spec.model.adapters:
        return []
    from enginefoundry.inputs.adapters import adapter_problems

    lane = get_lane(spec.lane)
    return adapter_problems(spec, lane.name, lane.max_lora_rank)


def _prices_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """The prices file a search names, read as the cost step reads it (bounded, a regular file, names and finite
    positive prices): a file that is missing or not a price table fails here, before any build."""
    from enginefoundry.bench.costs import price_table

    if spec.search is None or not spec.search.prices.file:
        return []
    try:
        price_table(spec)
    except SpecError as err:
        return list(err.problems)
    return []


def _signature_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """The spec's signature policy: its key files readable public keys, and a signing key when it requires
    signatures (a run would otherwise publish builds its own consumers refuse)."""
    from enginefoundry.evidence.signing import require_signer_for, spec_policy

    problems = []
    for check in (spec_policy, require_signer_for):
        try:
            check(spec)
        except InputError as err:
            field, sep, rest = str(err).partition(": ")
            problems.append((field, rest) if sep and field.startswith("publish.") else ("publish", str(err)))
    return problems


def _prompt_file_problems(path: Path) -> list[tuple[str, str]]:
    try:
        load_prompt_set(path)
    except InputError as err:
        return [("smoke.prompts", str(err).removeprefix("smoke.prompts: "))]
    return []


def _prompt_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """A malformed prompt set, or one with fewer graded prompts than the policy of a variant's precision needs
    (its sample-size rule would reject every unit of that precision, healthy or not)."""
    path = spec.resolve_path(spec.smoke.prompts)
    problems = _prompt_file_problems(path)
    if problems:
        return problems
    prompts = load_prompt_set(path)
    for precision in dict.fromkeys(v.precision.value for v in spec.variants):
        try:
            check_prompt_count(prompts, policy_for(precision, **spec.smoke.policy_overrides()),
                               spec.smoke.small_sample, precision)
        except InputError as err:
            problems.append(("smoke.prompts", str(err).removeprefix("smoke.prompts: ")))
    return problems


def validate_file(path: str | Path, only_targets: list[str] | None = None) -> BuildSpec:
    """Every check that needs no download, all problems in one SpecError. Returns the parsed spec."""
    try:
        spec = load_spec(path)
    except SpecError as err:
        raise SpecError(err.problems + _raw_input_problems(Path(path)), err.source) from None
    problems = _deep_problems(spec)
    problems += _source_problems(spec)
    if _BAD_MODEL_NAME.search(spec.registered_model_name):
        field = "tracking.registered_model" if spec.tracking.registered_model else "model.name"
        problems.append((field, f"'{spec.registered_model_name}' is not a valid MLflow registered-model name "
                                "(no '/', ':' or '%'); set tracking.registered_model, e.g. "
                                f"{re.sub(r'[/:%]', '-', spec.registered_model_name)}"))
    from enginefoundry.planning.plan_report import SPEC_CHECK, plan_report

    report = plan_report(spec, only_targets)
    for unit_name, verdict in report.preflight.items():
        for check in verdict.problems:
            if check.name == SPEC_CHECK:  # a lane-option refusal: reported above by its field
                continue
            problems.append((f"unit {unit_name}", check.message + (f" (fix: {check.fix})" if check.fix else "")))
    if problems:
        raise SpecError(problems, str(path))
    return spec


def _source_problems(spec: BuildSpec) -> list[tuple[str, str]]:
    """A local source checked as `run` checks it (build.sources.check_local: a folder with config.json, not a system
    folder, no symlink leading out of it), so that `validate` and `run` agree."""
    from enginefoundry.inputs.sources import check_local

    src = spec.model.parsed_source(spec.base_path)
    if src.kind is SourceKind.LOCAL:
        folder = Path(src.location)
        if not folder.is_dir():
            return [("model.source", f"local folder {folder} does not exist; check the path in the spec")]
        if not (folder / "config.json").is_file():
            return [("model.source", f"{folder} has no config.json; point it at a Hugging Face checkpoint folder")]
        try:
            check_local(src)
        except SourceError as err:
            return [("model.source", str(err).removeprefix("model.source: "))]
    return []


def _raw_input_problems(path: Path) -> list[tuple[str, str]]:
    """Input files named by a spec whose fields are invalid: checked from the raw YAML, so one pass finds both."""
    try:
        data: object = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return []
    smoke = data.get("smoke") if isinstance(data, dict) else None
    prompts = smoke.get("prompts") if isinstance(smoke, dict) else None
    if not isinstance(prompts, str):
        return []
    p = Path(prompts)
    return _prompt_file_problems(p if p.is_absolute() else (path.resolve().parent / p).resolve())
