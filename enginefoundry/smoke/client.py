"""Ask an OpenAI-compatible endpoint for greedy answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from enginefoundry.errors import ToolError
from enginefoundry.smoke.prompts import PromptCase


def chat_completion(
    base_url: str, model: str, case: PromptCase, *, max_tokens: int, timeout_s: float = 120.0
) -> str:
    body = {
        "model": model,
        "messages": case.chat(),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise ToolError(f"smoke: the endpoint answered HTTP {err.code} for prompt '{case.id}': {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ToolError(f"smoke: the endpoint {base_url} stopped answering at prompt '{case.id}': {err}") from None
    try:
        return (payload["choices"][0]["message"]["content"] or "").strip()
    except (KeyError, IndexError, TypeError):
        raise ToolError(f"smoke: unexpected response shape for prompt '{case.id}': {str(payload)[:300]}") from None
