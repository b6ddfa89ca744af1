"""Content identity: streaming digests and canonical JSON.

Digests are computed by reading in fixed-size chunks, so memory stays flat whatever the file size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHUNK = 8 * 1024 * 1024

# Files that make up the tokenizer; everything else in a checkpoint folder counts as weights/config.
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "vocab.json", "merges.txt",
})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """Stable JSON: sorted keys, no whitespace, so equal content always hashes equal."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def list_files(root: Path) -> list[Path]:
    """Regular files under root (symlinks followed, as in an HF snapshot), sorted, hidden entries skipped."""
    return sorted(
        p for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def digest_files(root: Path, files: Iterable[Path]) -> tuple[str, dict[str, str]]:
    """(combined digest, {relative path: sha256}) over the given files."""
    per_file = {p.relative_to(root).as_posix(): sha256_file(p) for p in files}
    return sha256_json(per_file), per_file


def checkpoint_digests(root: Path) -> tuple[str, str, dict[str, str]]:
    """(weights digest, tokenizer digest, per-file sha256) of a checkpoint folder."""
    files = list_files(root)
    tok = [p for p in files if p.name in TOKENIZER_FILES]
    rest = [p for p in files if p.name not in TOKENIZER_FILES]
    weights_digest, per_w = digest_files(root, rest)
    tok_digest, per_t = digest_files(root, tok)
    return weights_digest, tok_digest, {**per_w, **per_t}
