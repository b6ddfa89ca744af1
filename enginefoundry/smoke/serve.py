"""A small OpenAI-compatible model server that returns log-probs: the reference lane's scoring endpoint.

    python -m enginefoundry.smoke.serve MODEL_DIR --host 127.0.0.1 --port 8000 [--device cpu] [--name NAME]

Why it exists: `transformers serve` (5.24.0) ignores `logprobs`, `top_logprobs` (transformers/cli/serving/
chat_completion.py, UNUSED_CHAT_COMPLETION_FIELDS) and `echo` (cli/serving/completion.py,
UNUSED_LEGACY_COMPLETION_FIELDS), so the smoke gate's log-prob checks could not run against the reference lane.
This server answers, with the same Hugging Face model code and greedy decoding:

  * `POST /v1/chat/completions`: greedy answers; `logprobs: true` (+ `top_logprobs: k`) returns each generated
    token's log-prob (raw logits, before any processor) in the chat shape `choices[0].logprobs.content`;
  * `POST /v1/completions`: `prompt` as text or token ids; with `echo: true` and `logprobs: k` the answer's
    `logprobs.token_logprobs` / `top_logprobs` cover the prompt tokens too (the first is null), as vLLM's server
    does: that is how the gate scores the reference's continuation under the served model (teacher forcing);
  * `GET /health`, `GET /v1/models`.

Requests are answered one at a time (one model, one lock); a request for another model name gets 404, a prompt
longer than the model's positions 400, a failure inside the model 500 with the error on the log's last line.
No Prefect, no network beyond the socket it listens on.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("enginefoundry.smoke.serve")
MAX_TOP = 20


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Scorer:
    """The model and its tokenizer, and the two things the server does with them."""

    def __init__(self, model_dir: Path, device: str = "cpu", max_seq_len: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        self.model: Any = model.to(device).eval()
        self.device = device
        self.lock = threading.Lock()
        self.special = set(self.tok.all_special_ids)
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        cfg = self.model.config
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        self.max_seq_len = max_seq_len

    def _fit(self, n: int, new: int) -> int:
        """max_tokens for a prompt of n tokens: a prompt that does not fit is refused (400); with --max-seq-len an
        answer gets at most max_seq_len − n tokens (finish_reason "length"), as an engine clamps a request."""
        if self.max_seq_len is not None:
            if n >= self.max_seq_len:
                raise RequestError(400, f"prompt of {n} tokens does not fit max_seq_len {self.max_seq_len}")
            new = min(new, self.max_seq_len - n)
        if self.max_positions is not None and n + new > self.max_positions:
            raise RequestError(400, f"prompt of {n} tokens + max_tokens {new} exceeds the model's "
                                    f"{self.max_positions} positions")
        return new

    def _top(self, row: Any, k: int) -> list[tuple[str, float]]:
        vals, idx = self.torch.topk(row, k)
        pairs = zip(vals.tolist(), idx.tolist(), strict=True)
        return [(str(self.tok.decode([int(i)])), clamp(float(v))) for v, i in pairs]

    def chat(self, messages: list[dict[str, Any]],  # JSON edge: the request's OpenAI chat messages
             max_tokens: int, top: int | None) -> dict[str, Any]:  # JSON edge: OpenAI chat response
        try:
            enc: Any = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
        except ValueError as err:  # e.g. no chat template: the server's failure, said in its log
            raise RequestError(500, f"{type(err).__name__}: {err}") from None
        n = int(enc["input_ids"].shape[1])
        max_tokens = self._fit(n, max_tokens)
        with self.lock, self.torch.no_grad():
            gen = self.model.generate(**enc.to(self.device), max_new_tokens=max_tokens, do_sample=False,
                                      pad_token_id=self.tok.pad_token_id, output_logits=True,
                                      return_dict_in_generate=True)
        new = gen.sequences[0, n:].tolist()
        stopped = bool(new) and (new[-1] in self.eos or len(new) < max_tokens)
        content = []
        if top is not None:
            for i, t in enumerate(new):
                if t in self.special:
                    continue
                row = self.torch.log_softmax(gen.logits[i][0].float(), dim=-1)
                item: dict[str, Any] = {  # JSON edge: a response logprob entry
                    "token": self.tok.decode([t]), "logprob": clamp(float(row[t]))}
                if top:
                    item["top_logprobs"] = [{"token": s, "logprob": v} for s, v in self._top(row, top)]
                content.append(item)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop" if stopped else "length",  # JSON edge
                                  "message": {"role": "assistant",
                                              "content": self.tok.decode(new, skip_special_tokens=True)},
                                  "logprobs": {"content": content} if top is not None else None}
        return {"object": "chat.completion", "choices": [choice],
                "usage": {"prompt_tokens": n, "completion_tokens": len(new), "total_tokens": n + len(new)}}

    def complete(self, prompt: str | list[int], max_tokens: int, echo: bool,
                 top: int | None) -> dict[str, Any]:  # JSON edge: OpenAI completions response
        ids: list[int] = prompt if isinstance(prompt, list) else \
            list(self.tok(prompt, add_special_tokens=False)["input_ids"])
        if not ids:
            raise RequestError(400, "empty prompt")
        n = len(ids)
        max_tokens = self._fit(n, max_tokens)
        torch = self.torch
        x = torch.tensor([ids], device=self.device)
        with self.lock, torch.no_grad():
            prompt_rows = torch.log_softmax(self.model(x).logits[0].float(), dim=-1) if echo and top is not None \
                else None
            new: list[int] = []
            rows: list[Any] = []
            if max_tokens > 0:
                gen = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                          do_sample=False, pad_token_id=self.tok.pad_token_id, output_logits=True,
                                          return_dict_in_generate=True)
                new = gen.sequences[0, n:].tolist()
                rows = [torch.log_softmax(lg[0].float(), dim=-1) for lg in gen.logits]
        text = self.tok.decode(new, skip_special_tokens=True)
        logprobs = None
        if top is not None:
            toks, lps, tops = [], [], []
            if prompt_rows is not None:
                for i, t in enumerate(ids):
                    toks.append(self.tok.decode([t]))
                    lps.append(None if i == 0 else clamp(float(prompt_rows[i - 1][t])))
                    tops.append(None if i == 0 else dict(self._top(prompt_rows[i - 1], max(top, 1))))
            for t, row in zip(new, rows, strict=False):
                toks.append(self.tok.decode([t]))
                lps.append(clamp(float(row[t])))
                tops.append(dict(self._top(row, max(top, 1))))
            offsets, at = [], 0
            for s in toks:
                offsets.append(at)
                at += len(s)
            logprobs = {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
        full = (str(self.tok.decode(ids)) if echo else "") + str(text)
        stopped = bool(new) and (new[-1] in self.eos or len(new) < max_tokens)
        return {"object": "text_completion",
                "choices": [{"index": 0, "text": full, "logprobs": logprobs,
                             "finish_reason": "stop" if stopped else "length"}],
                "usage": {"prompt_tokens": n, "completion_tokens": len(new), "total_tokens": n + len(new)}}


def _int_field(body: dict[str, Any],  # JSON edge: the request body
               name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool):  # chat's `logprobs: true`
        return int(v)
    if not isinstance(v, int) or not lo <= v <= hi:
        raise RequestError(400, f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _handle(scorer: Scorer, name: str, path: str, body: Any) -> dict[str, Any]:  # JSON edge: the response body
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if body.get("model") not in (None, name):
        raise RequestError(404, f"model '{body.get('model')}' is not served here; this server serves '{name}'")
    if body.get("stream"):
        raise RequestError(400, "stream is not supported")
    if path == "/v1/chat/completions":
        messages: Any = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list")
        max_tokens = _int_field(body, "max_tokens", 16, 1, 1 << 16) or 16
        want = bool(body.get("logprobs"))
        top = _int_field(body, "top_logprobs", 0, 0, MAX_TOP) if want else None
        return scorer.chat(messages, max_tokens, top)
    if path == "/v1/completions":
        prompt: Any = body.get("prompt")
        ok_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        if not (isinstance(prompt, str) or ok_ids):
            raise RequestError(400, "prompt must be a string or a list of token ids")
        vocab = scorer.model.config.vocab_size
        if ok_ids and any(not 0 <= t < vocab for t in prompt):
            raise RequestError(400, f"prompt token ids must be in [0, {vocab})")
        top = _int_field(body, "logprobs", None, 0, MAX_TOP)
        return scorer.complete(prompt, _int_field(body, "max_tokens", 16, 0, 1 << 16) or 0, bool(body.get("echo")),
                               top)
    raise RequestError(404, f"no route {path}")


def make_server(scorer: Scorer, name: str, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), fmt % args)

        def _send(self, status: int, payload: dict[str, Any]) -> None:  # JSON edge: the response body
            data = json.dumps(payload, allow_nan=False, default=_finite).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > 16 << 20:
                    raise RequestError(413, "request body over 16 MiB")
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except json.JSONDecodeError:
                    raise RequestError(400, "the request body is not JSON") from None
                self._send(200, _handle(scorer, name, self.path, body))
            except RequestError as err:
                if err.status >= 500:
                    log.error("%s", err)
                self._send(err.status, {"error": {"message": str(err), "code": err.status}})
            except Exception as err:  # the model failed: a 5xx with the cause on the log's last line
                log.error("%s", traceback.format_exc().rstrip())
                log.error("%s: %s", type(err).__name__, err)
                self._send(500, {"error": {"message": f"{type(err).__name__}: {err}", "code": 500}})

    return ThreadingHTTPServer((host, port), Handler)


def _finite(x: Any) -> Any:
    raise TypeError(f"not JSON: {x!r}")


def clamp(lp: float) -> float:
    """-inf (a token the model rules out) as the lowest finite log-prob OpenAI servers report."""
    return lp if math.isfinite(lp) else -9999.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--name", help="the `model` requests must carry (default: model_dir as given)")
    ap.add_argument("--max-seq-len", type=int, help="prompt + answer tokens per request, as an engine's limit")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import os

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    scorer = Scorer(Path(args.model_dir), device=args.device, max_seq_len=args.max_seq_len)
    server = make_server(scorer, args.name or args.model_dir, args.host, args.port)
    log.info("serving %s on http://%s:%d", args.name or args.model_dir, args.host, args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
