"""Everything that can be checked before any download or GPU time, reported at once."""

from __future__ import annotations

from enginefoundry.errors import InputError, SpecError
from enginefoundry.lanes import get_lane
from enginefoundry.smoke import load_prompt_set
from enginefoundry.spec import BuildSpec


def validate_deep(spec: BuildSpec) -> None:
    """Lane options (removed flags …), input files. Raises SpecError listing every problem."""
    problems = list(get_lane(spec.lane).validate_options(spec))
    try:
        load_prompt_set(spec.resolve_path(spec.smoke.prompts))
    except InputError as err:
        problems.append(("smoke.prompts", str(err).removeprefix("smoke.prompts: ")))
    if problems:
        raise SpecError(problems, spec.name)
