"""Ask an OpenAI-compatible endpoint for greedy answers, with token log-probs where it returns them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, TypeAlias

from pydantic import BaseModel, JsonValue

from enginefoundry.errors import ToolError
from enginefoundry.smoke.prompts import PromptCase

RequestFields: TypeAlias = dict[str, JsonValue]
"""Fields of an OpenAI chat request body (the endpoint's API; a lane's extra fields, e.g. `speculative: false`)."""

class TokenLogprob(BaseModel):
    token: str
    logprob: float


class ScoredToken(BaseModel):
    """One reference token, scored under the served model with the reference's prompt and answer before it."""

    logprob: float  # the served model's log-prob of the reference token
    top1: bool | None = None  # the reference token is the served model's argmax (None: no top log-probs returned)


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
                 timeout_s: float = 600.0, extra: RequestFields | None = None) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.want_logprobs = want_logprobs
        self.timeout_s = timeout_s
        # fields every request carries (the twin's `speculative: false`, a served adapter's lora_request)
        self.extra = dict(extra or {})
        self.logprobs_refused: str | None = None
        self.scoring_unavailable: str | None = None  # why teacher forcing cannot run against this endpoint

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

    def score(self, case_id: str, prompt_ids: list[int], answer_ids: list[int]) -> list[ScoredToken] | None:
        """Teacher forcing: the reference's answer scored under the served model, through the legacy completions
        API with the templated prompt and the answer as token ids, `echo: true, logprobs: 1, max_tokens: 1`
        (vLLM's and this package's own server, enginefoundry/smoke/serve.py, return the prompt tokens' log-probs
        then). None, with `scoring_unavailable` set to why, where the endpoint returns none for the prompt: it
        ignores the fields (transformers serve 5.24), or returns log-probs of generated tokens only (trtllm-serve:
        tensorrt_llm/serve/postprocess_handlers.py `completion_response_post_processor`, echo prepends the prompt
        text, log-probs cover `output.token_ids`)."""
        if self.scoring_unavailable is not None:
            return None
        ids = prompt_ids + answer_ids
        body: RequestFields = {"model": self.model, "prompt": list[JsonValue](ids), "max_tokens": 1, "echo": True,
                               "logprobs": 1, "temperature": 0.0, "stream": False}
        body.update(self.extra)  # the same selection as the answers (a served adapter's lora_request)
        url = self.base_url.rstrip("/") + "/v1/completions"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:200]
            self.scoring_unavailable = (f"the endpoint answered HTTP {err.code} to /v1/completions with echo and "
                                        f"logprobs ('{case_id}': {detail})")
            return None
        except (urllib.error.URLError, OSError) as err:
            raise ToolError(f"smoke: the endpoint {self.base_url} stopped answering while scoring '{case_id}': "
                            f"{getattr(err, 'reason', err)}") from None
        except json.JSONDecodeError:
            raise ToolError(f"smoke: the endpoint answered the scoring of '{case_id}' with something other than "
                            "JSON") from None
        scored, why = parse_prompt_logprobs(payload, len(prompt_ids), answer_ids)
        if scored is None:
            self.scoring_unavailable = why
        return scored

    def _ask(self, case: PromptCase, *, logprobs: bool, max_tokens: int | None = None) -> ServedAnswer:
        body: RequestFields = {"model": self.model, "messages": _json_chat(case),
                               "max_tokens": max_tokens or self.max_tokens, "temperature": 0.0, "stream": False}
        if logprobs:
            body.update({"logprobs": True, "top_logprobs": 1})
        body.update(self.extra)
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


def _int(value: JsonValue) -> int | None:
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


def parse_prompt_logprobs(payload: Any, n_prompt: int,
                          answer_ids: list[int]) -> tuple[list[ScoredToken] | None, str]:
    """The answer tokens' log-probs from a legacy completions response with echo (`choices[0].logprobs`:
    `token_logprobs` and `top_logprobs` over prompt + generated tokens); None and why when it has none."""
    try:
        block = payload["choices"][0].get("logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None, f"unexpected response shape from /v1/completions: {str(payload)[:200]}"
    need = n_prompt + len(answer_ids)
    if not isinstance(block, dict) or not isinstance(block.get("token_logprobs"), list):
        return None, ("the endpoint returned no log-probs for `echo: true, logprobs: 1` on /v1/completions (it "
                      "ignores the fields)")
    lps = block["token_logprobs"]
    if len(lps) < need:
        return None, (f"the endpoint returned {len(lps)} token log-probs for an echoed prompt of {need} tokens "
                      "(log-probs of generated tokens only, none of the prompt's)")
    tops = block.get("top_logprobs") if isinstance(block.get("top_logprobs"), list) else None
    out = []
    for i in range(n_prompt, need):
        lp = lps[i]
        if not isinstance(lp, int | float) or isinstance(lp, bool):
            return None, f"token log-prob {i} is not a number: {lp!r}"
        top = tops[i] if tops is not None and i < len(tops) else None
        best = max((v for v in top.values() if isinstance(v, int | float)), default=None) \
            if isinstance(top, dict) else None
        out.append(ScoredToken(logprob=float(lp), top1=None if best is None else float(lp) >= best - 1e-6))
    return out, ""


def _json_chat(case: PromptCase) -> list[JsonValue]:
    """The case's chat messages as the request body's JSON."""
    return [{key: value for key, value in message.items()} for message in case.chat()]
