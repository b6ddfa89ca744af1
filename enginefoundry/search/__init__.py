"""Deciding what to build: the configuration predictor (AIConfigurator, run in its own venv) and the plan that
ranks its predictions, keeps the top-k and writes them back as the spec's variants. The domain's top layer.

Its face (`__all__`): what other packages use of it, loaded on first use (enginefoundry/_face.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefoundry._face import lazy_face

if TYPE_CHECKING:
    from enginefoundry.search.plan import disagg_lines, materialise, rows

__all__ = ["disagg_lines", "materialise", "rows"]

__getattr__, __dir__ = lazy_face(__name__)
