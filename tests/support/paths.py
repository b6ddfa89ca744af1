"""Where the repository, its configs and the test fixtures are, for every tier."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
FIXTURES = REPO / "tests" / "fixtures"
TINY_MODEL = FIXTURES / "tiny-chat" / "model"
TINY_PROMPTS = CONFIGS / "prompts" / "tiny-chat.jsonl"
STACK_SCRIPT = REPO / "scripts" / "stack.py"
