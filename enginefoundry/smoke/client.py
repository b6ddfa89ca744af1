"""Ask an OpenAI-compatible endpoint for greedy answers, with token log-probs where it returns them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel

from enginefoundry.errors import ToolError
from enginefoundry.smoke.prompts import PromptCase


class TokenLogprob(BaseModel):
    token: str
    logprob: float


class ServedAnswer(BaseModel):
    text: str
    logprobs: list[TokenLogprob] | None = None  # None: the endpoint returned no log-probs for this answer
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # usage.prompt_tokens: the server's count of the templated prompt
    completion_tokens: int | None = None
    refused: str | None = None  # the endpoint answered this prompt with an HTTP error (e.g. prompt too long)
    server_error: bool = False  # that error was a 5xx: the server failed, not the request


class _Refused(Exception):
    """The endpoint rejected the log-prob fields (some servers answer 400/422 to fields they lack)."""


class ChatClient:
    """Greedy chat completions against one endpoint.

    It asks for `logprobs: true, top_logprobs: 1` until the endpoint refuses them; then it stops asking
    and `logprobs_refused` holds the endpoint's answer. An endpoint that silently ignores the fields
    (transformers serve 5.24 does) simply returns answers without log-probs.
    """

    def __init__(self, base_url: str, model: str, *, max_tokens: int, want_logprobs: bool = True,
                 timeout_s: float = 600.0) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.want_logprobs = want_logprobs
        self.timeout_s = timeout_s
        self.logprobs_refused: str | None = None

    def answer(self, case: PromptCase, *, max_tokens: int | None = None) -> ServedAnswer:
        """Thread-safe: `run_smoke` asks several prompts at once (the only shared state is `logprobs_refused`,
        which every thread may set to the endpoint's same answer)."""
        if self.want_logprobs and self.logprobs_refused is None:
            try:
                return self._ask(case, logprobs=True, max_tokens=max_tokens)
            except _Refused as err:
                self.logprobs_refused = str(err)
        return self._ask(case, logprobs=False, max_tokens=max_tokens)

    def probe(self, case: PromptCase) -> ServedAnswer:
        """One token of the first prompt, before any reference work: a dead endpoint, a wrong URL or model name
        is found in a second (ToolError), not after the reference is computed or loaded."""
        return self.answer(case, max_tokens=1)

    def _ask(self, case: PromptCase, *, logprobs: bool, max_tokens: int | None = None) -> ServedAnswer:
        body: dict[str, Any] = {"model": self.model, "messages": case.chat(),
                                "max_tokens": max_tokens or self.max_tokens, "temperature": 0.0, "stream": False}
        if logprobs:
            body.update({"logprobs": True, "top_logprobs": 1})
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if logprobs and err.code in (400, 422) and "logprob" in detail.lower():
                raise _Refused(f"HTTP {err.code}: {detail}") from None
            if err.code in (401, 403, 404):  # wrong URL, model name or credentials: nothing to judge
                raise ToolError(f"smoke: the endpoint answered HTTP {err.code} for prompt '{case.id}': "
                                f"{detail}") from None
            # A request the server cannot serve (prompt longer than its max_seq_len, an internal error): the gate
            # judges it as a refused answer instead of stopping; a 5xx is the server's own failure.
            return ServedAnswer(text="", refused=f"HTTP {err.code}: {detail}", server_error=err.code >= 500)
        except (urllib.error.URLError, OSError) as err:
            raise ToolError(f"smoke: the endpoint {self.base_url} stopped answering at prompt '{case.id}': "
                            f"{getattr(err, 'reason', err)}") from None
        except json.JSONDecodeError:
            raise ToolError(f"smoke: the endpoint answered prompt '{case.id}' with something other than JSON") from None
        try:
            choice = payload["choices"][0]
            text = (choice["message"]["content"] or "").strip()
        except (KeyError, IndexError, TypeError):
            raise ToolError(f"smoke: unexpected response shape for prompt '{case.id}': {str(payload)[:300]}") from None
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        return ServedAnswer(text=text, logprobs=parse_logprobs(choice.get("logprobs")),
                            finish_reason=choice.get("finish_reason"), prompt_tokens=_int(usage.get("prompt_tokens")),
                            completion_tokens=_int(usage.get("completion_tokens")))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_logprobs(block: Any) -> list[TokenLogprob] | None:
    """OpenAI chat `choices[i].logprobs` → tokens; None when absent or not in the chat shape."""
    if not isinstance(block, dict) or not isinstance(block.get("content"), list):
        return None
    out = []
    for item in block["content"]:
        try:
            out.append(TokenLogprob(token=str(item["token"]), logprob=float(item["logprob"])))
        except (KeyError, TypeError, ValueError):
            return None
    return out
