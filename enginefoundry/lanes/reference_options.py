"""`lane_options` of the reference lane (transformers + PyTorch), as a pydantic model: strict, unknown keys refused.

Kept apart from the lane's module so that reading a spec imports no more than this model."""

from __future__ import annotations

import difflib
from typing import ClassVar, Literal

from pydantic import Field

from enginefoundry.spec.lane_options import LaneOptions

# Which server the pipeline's smoke stage judges (docs/smoke-gate.md, "Which servers return them"):
#   scoring:      enginefoundry/smoke/serve.py, the same transformers model code, returns log-probs (chat and echoed
#                 prompts), so both log-prob checks run; it does not stream, so the benchmark and the published
#                 serve.sh keep `transformers serve`;
#   transformers: `transformers serve` itself, the server the unit ships with; it returns no log-probs, so both
#                 log-prob checks are reported as not run.
SmokeServer = Literal["scoring", "transformers"]


class ReferenceOptions(LaneOptions):
    smoke_server: SmokeServer = Field(
        default="scoring", description="the server the smoke stage judges: scoring (enginefoundry.smoke.serve, "
        "returns log-probs) or transformers (`transformers serve`, no log-prob checks); the benchmark and serve.sh "
        "run `transformers serve` either way; not part of the unit key")

    # The smoke server changes how a build is judged, not what it is: a unit's key leaves it out, so switching it
    # neither rebuilds nor re-judges a published unit (`--force` does).
    unkeyed: ClassVar[frozenset[str]] = frozenset({"smoke_server"})

    @classmethod
    def explain_unknown(cls, key: str, pinned: str | None) -> str | None:
        close = difflib.get_close_matches(key, list(cls.model_fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown option for lane reference{hint}; valid options: {', '.join(sorted(cls.model_fields))}"


def reference_options(options: LaneOptions | None) -> ReferenceOptions:
    """The spec's options as this lane's model (`None` or another lane's empty options: every default)."""
    if isinstance(options, ReferenceOptions):
        return options
    return ReferenceOptions.model_validate(options.given() if options is not None else {})
