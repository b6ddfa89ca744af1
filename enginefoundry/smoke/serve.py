"""A small OpenAI-compatible model server that returns log-probs: the reference lane's scoring endpoint.

    python -m enginefoundry.smoke.serve MODEL_DIR --host 127.0.0.1 --port 8000 [--device cpu] [--name NAME]
        [--max-seq-len N] [--max-batch 16] [--threads N] [--draft DRAFT_DIR --max-draft-len 3]
        [--adapter NAME=ADAPTER_DIR ... [--lora-request]]

Why it exists: `transformers serve` (5.24.0) ignores `logprobs`, `top_logprobs` (transformers/cli/serving/
chat_completion.py, UNUSED_CHAT_COMPLETION_FIELDS) and `echo` (cli/serving/completion.py,
UNUSED_LEGACY_COMPLETION_FIELDS), so the smoke gate's log-prob checks could not run against the reference lane.
This server answers, with the same Hugging Face model code and greedy decoding:

  * `POST /v1/chat/completions`: greedy answers; `logprobs: true` (+ `top_logprobs: k`) returns each generated
    token's log-prob (raw logits, before any processor) in the chat shape `choices[0].logprobs.content`;
  * `POST /v1/completions`: `prompt` as text or token ids; with `echo: true` and `logprobs: k` the answer's
    `logprobs.token_logprobs` / `top_logprobs` cover the prompt tokens too (the first is null), as vLLM's server
    does: that is how the gate scores the reference's continuation under the served model (teacher forcing);
  * `POST /v1/chat/completions` with `stream: true`: the whole answer, then sent as one server-sent chunk per token
    (so a streaming benchmark client such as AIPerf can measure a speculative unit's throughput; its time to first
    token is the whole answer's latency here);
  * `GET /health`, `GET /v1/models`;
  * with `--draft` (the reference lane's draft/target speculation, issue 37): greedy answers come from transformers'
    assisted generation (`generate(..., assistant_model=draft)`, `--max-draft-len` candidate tokens per step, the
    target verifying each), one request at a time; a request with `"speculative": false` is answered by the target
    alone (the unit's non-speculative twin, which the gate compares answers with), and `GET /v1/speculative` gives
    the drafted and accepted draft tokens so far (the benchmark's acceptance rate). `--unverified-draft` accepts the
    draft's tokens without verification: a deliberately broken speculative path, for the test that the gate's
    lossless rule rejects it; never for serving;
  * with `--adapter NAME=DIR` (repeatable; model.adapters in adapter_mode serve, issue 36): the base and every LoRA
    adapter on one model with PEFT (`PeftModel.from_pretrained` for the first, `load_adapter` for the others); a
    request's OpenAI `model` picks what answers it: an adapter's name that adapter (`set_adapter`), the served name
    the base alone (`disable_adapter`). Requests of different adapters never share a batch. `GET /v1/models` lists
    the base and every adapter; `GET /v1/adapters` the requests, completion tokens and seconds spent answering so far,
    per served name (the benchmark's per-adapter figures). `--lora-request` selects them as trtllm-serve does
    instead (the fake TensorRT-LLM toolchain's trtllm-serve): by the body's `lora_request` {lora_name, lora_int_id,
    lora_path}, the path an --adapter folder, `model` the served name. `--ignore-adapters` answers every request
    with the base whatever it asked for: a deliberately broken adapter path, for the test that the gate rejects it;
    never for serving.

Requests are batched: one worker thread owns the model and runs the requests that arrived together (within a few
milliseconds, up to --max-batch) as one batch: greedy generation over left-padded prompts, and one forward pass
over right-padded prompts for echoed log-probs. A batch that fails is retried one request at a time, so one bad
request fails alone. A request for another model name gets 404, a prompt longer than the model's positions 400,
a failure inside the model 500 with the error on the log's last line. No Prefect, no network beyond the socket it
listens on.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import os
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefoundry.inputs.dequantize import simulate_activations

if TYPE_CHECKING:
    from torch import Tensor
    from transformers.generation.utils import GenerateDecoderOnlyOutput
    from transformers.modeling_outputs import CausalLMOutputWithPast

log = logging.getLogger("enginefoundry.smoke.serve")
MAX_TOP = 20
SPECULATIVE_PATH = "/v1/speculative"  # GET: the draft tokens proposed and accepted so far
ADAPTERS_PATH = "/v1/adapters"  # GET: requests, completion tokens and seconds so far, per served model name
STREAM_PIECES = "_stream_pieces"  # the answer's text per token, sent as SSE chunks (never in a JSON answer)
LOGITS_BUDGET_BYTES = 1 << 30  # float32 logits of one echo batch (tokens × vocabulary × 4 bytes)
# Generation-config fields that leave greedy decoding the raw argmax (no logits processor): with only these
# set, an echoed prompt's next token is read off the same forward pass instead of a second one.
_PLAIN_GREEDY_DEFAULTS: dict[str, tuple[object, ...]] = {
    "repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0),
    "sequence_bias": (None,), "encoder_repetition_penalty": (None, 1.0), "exponential_decay_length_penalty": (None,),
}


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Result:
    """What the model computed for one request: generated ids, and where asked, log-probs with their top-k."""

    new: list[int]
    gen: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)  # per generated token
    prompt: list[tuple[float, list[tuple[int, float]]]] | None = None  # per prompt token after the first


@dataclass
class Job:
    ids: list[int]
    max_tokens: int
    top: int | None  # log-probs (with this many alternatives) of the generated tokens; None: none
    echo_top: int | None = None  # log-probs of the prompt tokens too (completions with echo)
    speculative: bool = True  # with a draft: assisted generation; False: the target alone (the twin)
    adapter: str | None = None  # with --adapter: the LoRA adapter that answers; None: the base alone
    done: Future[Result] = field(default_factory=Future)


@dataclass
class ServedCounts:
    """What one served model name (the base, or an adapter) answered since the server started."""

    requests: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0  # summed request latency (queue + batch), for the mean


@dataclass
class DraftStats:
    """Draft tokens proposed and accepted by the target's verification, since the server started."""

    requests: int = 0
    drafted: int = 0
    accepted: int = 0


class Scorer:
    """The model and its tokenizer: batches of jobs in, results out. Only the batcher's thread calls `run`."""

    def __init__(self, model_dir: Path, device: str = "cpu", max_seq_len: int | None = None,
                 draft_dir: Path | None = None, max_draft_len: int = 3, unverified: bool = False,
                 adapters: dict[str, Path] | None = None, ignore_adapters: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        # A dequantized FP8/NVFP4 checkpoint that carries its input quantization computes it here too, as the
        # smoke reference does (inputs/dequantize.py): a folder computes what it says wherever it is loaded.
        simulate_activations(model, Path(model_dir))
        self.adapters = sorted(adapters or {})
        self.adapter_dirs = {n: Path(folder).resolve() for n, folder in (adapters or {}).items()}
        self.ignore_adapters = ignore_adapters
        if adapters:
            from peft import PeftModel

            (first, first_dir), *rest = adapters.items()
            model = PeftModel.from_pretrained(model, str(first_dir), adapter_name=first)
            for name, folder in rest:
                model.load_adapter(str(folder), adapter_name=name)
        self.model: Any = model.to(device).eval()
        self.device = device
        self.special = set(self.tok.all_special_ids)
        gc = self.model.generation_config
        eos = gc.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        pad = gc.pad_token_id if gc.pad_token_id is not None else self.tok.pad_token_id
        self.pad = int(pad if pad is not None else min(self.eos, default=0))
        self.plain_greedy = all(getattr(gc, k, None) in ok for k, ok in _PLAIN_GREEDY_DEFAULTS.items())
        cfg = self.model.config
        self.vocab = int(cfg.vocab_size)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        self.max_seq_len = max_seq_len
        self._texts: dict[int, str] = {}
        self.draft: Any = None
        self.max_draft_len = max_draft_len
        self.unverified = unverified
        self.stats = DraftStats()
        self._verify: list[int] | None = None  # [prompt length, first call] while an assisted request runs
        if draft_dir is not None:
            draft: Any = AutoModelForCausalLM.from_pretrained(draft_dir, dtype="auto")
            self.draft = draft.to(device).eval()
            dgc = self.draft.generation_config
            # A constant number of candidates per step, never cut short by the draft's confidence: max_draft_len.
            dgc.num_assistant_tokens = max_draft_len
            dgc.num_assistant_tokens_schedule = "constant"
            dgc.assistant_confidence_threshold = 0.0
            self.model.register_forward_hook(self._count_verified, with_kwargs=True)

    # --- requests → jobs (in the request's thread) --------------------------------------------------------------

    def fit(self, n: int, new: int) -> int:
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

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:  # JSON edge: the request's chat messages
        try:
            enc: Any = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        except ValueError as err:  # e.g. no chat template: the server's failure, said in its log
            raise RequestError(500, f"{type(err).__name__}: {err}") from None
        return [int(t) for t in enc["input_ids"]]

    def text(self, token: int) -> str:
        got = self._texts.get(token)
        if got is None:
            got = self._texts[token] = str(self.tok.decode([token]))
        return got

    # --- batches (the batcher's thread) ------------------------------------------------------------------------

    def assisted(self, job: Job) -> bool:
        return self.draft is not None and job.speculative and job.echo_top is None

    def groups(self, jobs: list[Job], max_batch: int) -> list[list[Job]]:
        """Jobs that run well together: the same kind (echo or generation), max_tokens and adapter, prompts of similar
        length (padding at most doubles a group's tokens), an echo batch's logits within LOGITS_BUDGET_BYTES."""
        budget = max(1, LOGITS_BUDGET_BYTES // (4 * self.vocab))
        out: list[list[Job]] = []
        by_kind: dict[tuple[bool, int, str | None], list[Job]] = {}
        for j in jobs:
            if self.assisted(j):  # assisted generation runs one sequence at a time
                out.append([j])
                continue
            by_kind.setdefault((j.echo_top is not None, j.max_tokens, j.adapter), []).append(j)
        for (echo, _, _), same in by_kind.items():
            group: list[Job] = []
            for j in sorted(same, key=lambda j: len(j.ids)):
                n = len(j.ids)
                full = group and (len(group) >= max_batch or n > 2 * len(group[0].ids) + 64
                                  or (echo and (len(group) + 1) * n > budget))
                if full:
                    out.append(group)
                    group = []
                group.append(j)
            if group:
                out.append(group)
        return out

    def using(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        """The context a group runs in: its adapter active (PEFT set_adapter), or the base alone (disable_adapter);
        nothing without adapters. --ignore-adapters: always the base."""
        if not self.adapters:
            return contextlib.nullcontext()
        if adapter is None or self.ignore_adapters:
            base: contextlib.AbstractContextManager[None] = self.model.disable_adapter()
            return base
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()

    def run(self, group: list[Job]) -> list[Result]:
        with self.torch.inference_mode(), self.using(group[0].adapter):
            if self.assisted(group[0]):
                return [self._speculate(j) for j in group]
            if group[0].echo_top is None:
                return self._generate(group) if group[0].max_tokens > 0 else [Result(new=[]) for _ in group]
            results = self._echo(group)
            if group[0].max_tokens > 0 and not self.plain_greedy:
                for r, g in zip(results, self._generate(group), strict=True):
                    r.new, r.gen = g.new, g.gen
            return results

    def _pick(self, lsm: Tensor, tokens: list[int], k: int) -> list[tuple[float, list[tuple[int, float]]]]:
        """Each row's log-prob of its token and its top-k (at least the argmax), in one topk call."""
        torch = self.torch
        idx = torch.tensor(tokens, device=lsm.device).unsqueeze(1)
        lps = lsm.gather(1, idx).squeeze(1).tolist()
        vals, ids = torch.topk(lsm, max(k, 1), dim=-1)
        return [(clamp(lp), [(int(i), clamp(v)) for i, v in zip(ii, vv, strict=True)])
                for lp, ii, vv in zip(lps, ids.tolist(), vals.tolist(), strict=True)]

    def _generate(self, group: list[Job]) -> list[Result]:
        torch = self.torch
        width = max(len(j.ids) for j in group)
        x = torch.tensor([[self.pad] * (width - len(j.ids)) + j.ids for j in group], device=self.device)
        mask = torch.tensor([[0] * (width - len(j.ids)) + [1] * len(j.ids) for j in group], device=self.device)
        steps = max(j.max_tokens for j in group)
        gen = self.model.generate(input_ids=x, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                                  pad_token_id=self.pad, output_logits=True, return_dict_in_generate=True)
        return self._results(group, gen, width)

    def _results(self, group: list[Job], gen: GenerateDecoderOnlyOutput, width: int) -> list[Result]:
        torch = self.torch
        out = []
        for b, j in enumerate(group):
            new: list[int] = []
            for t in gen.sequences[b, width:].tolist()[:j.max_tokens]:
                new.append(int(t))
                if t in self.eos:
                    break
            res = Result(new=new)
            if j.top is not None and new:
                assert gen.logits is not None  # output_logits=True
                rows = torch.stack([gen.logits[i][b] for i in range(len(new))]).float()
                res.gen = self._pick(torch.log_softmax(rows, dim=-1), new, j.top)
            out.append(res)
        return out

    def _speculate(self, job: Job) -> Result:
        """One request through transformers' assisted generation: the draft proposes max_draft_len tokens, the
        target verifies them in one forward pass and keeps the agreeing prefix plus its own next token, so the
        answer is the target's greedy answer. `_count_verified` counts the proposed and accepted tokens."""
        if self.unverified:
            return self._unverified(job)
        torch = self.torch
        self.stats.requests += 1
        x = torch.tensor([job.ids], device=self.device)
        self._verify = [len(job.ids), 1]
        try:
            gen = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=job.max_tokens,
                                      do_sample=False, pad_token_id=self.pad, assistant_model=self.draft,
                                      output_logits=True, return_dict_in_generate=True)
        finally:
            self._verify = None
        return self._results([job], gen, len(job.ids))[0]

    def _count_verified(self, module: Any, args: Any, kwargs: dict[str, Any],  # JSON edge: torch's hook kwargs
                        output: CausalLMOutputWithPast) -> None:
        """A forward hook on the target: in assisted generation each target pass takes the candidates after the
        prompt (first pass) or after the last kept token; the accepted ones are the leading candidates that equal
        the target's own argmax at their position."""
        state, x = self._verify, kwargs.get("input_ids")
        if state is None or x is None:
            return
        n = int(x.shape[1])
        drafted = n - state[0] if state[1] else n - 1
        state[1] = 0
        logits = getattr(output, "logits", None)
        if drafted <= 0 or logits is None or logits.shape[1] < drafted + 1:
            return
        predicted = logits[0, -(drafted + 1):-1].argmax(-1).tolist()
        accepted = 0
        for p, t in zip(predicted, x[0, -drafted:].tolist(), strict=True):
            if p != t:
                break
            accepted += 1
        self.stats.drafted += drafted
        self.stats.accepted += accepted

    def _unverified(self, job: Job) -> Result:
        """--unverified-draft: the draft's tokens are kept as proposed, the target only adds one after each
        proposal. Deliberately wrong (the answers are no longer the target's): for the gate's lossless test."""
        torch = self.torch
        self.stats.requests += 1
        seq, new = list(job.ids), list[int]()
        while len(new) < job.max_tokens:
            x = torch.tensor([seq], device=self.device)
            d = self.draft.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                    max_new_tokens=min(self.max_draft_len, job.max_tokens - len(new)),
                                    pad_token_id=self.pad)
            proposed = [int(t) for t in d[0, len(seq):].tolist()]
            self.stats.drafted += len(proposed)
            self.stats.accepted += len(proposed)
            for t in proposed:
                new.append(t)
                seq.append(t)
                if t in self.eos:
                    return Result(new=new)
            if len(new) >= job.max_tokens:
                break
            nxt = int(self.model(input_ids=torch.tensor([seq], device=self.device)).logits[0, -1].argmax())
            new.append(nxt)
            seq.append(nxt)
            if nxt in self.eos:
                break
        return Result(new=new[:job.max_tokens])

    def _echo(self, group: list[Job]) -> list[Result]:
        torch = self.torch
        width = max(len(j.ids) for j in group)
        x = torch.tensor([j.ids + [self.pad] * (width - len(j.ids)) for j in group], device=self.device)
        mask = torch.tensor([[1] * len(j.ids) + [0] * (width - len(j.ids)) for j in group], device=self.device)
        logits = self.model(input_ids=x, attention_mask=mask).logits
        out = []
        for b, j in enumerate(group):
            n = len(j.ids)
            lsm = torch.log_softmax(logits[b, :n].float(), dim=-1)
            k = j.echo_top if j.echo_top is not None else 0
            res = Result(new=[], prompt=self._pick(lsm[:-1], j.ids[1:], k) if n > 1 else [])
            if j.max_tokens > 0:  # greedy: the argmax of the last row (run() regenerates when that is not greedy)
                nxt = int(torch.argmax(lsm[-1]))
                res.new = [nxt]
                if j.top is not None:
                    res.gen = self._pick(lsm[-1:], [nxt], j.top)
            out.append(res)
        return out


class Batcher:
    """One worker thread owns the model; request threads hand it jobs and wait for their results."""

    def __init__(self, scorer: Scorer, max_batch: int = 16, window_s: float = 0.005) -> None:
        self.scorer, self.max_batch, self.window_s = scorer, max_batch, window_s
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> Result:
        self.jobs.put(job)
        return job.done.result()

    def close(self) -> None:
        self.jobs.put(None)

    def _take(self) -> list[Job] | None:
        first = self.jobs.get()
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.window_s
        while len(batch) < 4 * self.max_batch:
            try:
                nxt = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if nxt is None:
                self.jobs.put(None)
                break
            batch.append(nxt)
        return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            for group in self.scorer.groups(batch, self.max_batch):
                self._run(group)

    def _run(self, group: list[Job]) -> None:
        t = time.monotonic()
        try:
            results = self.scorer.run(group)
        except Exception as err:
            if len(group) > 1:  # one bad request fails alone
                for j in group:
                    self._run([j])
                return
            log.error("%s", traceback.format_exc().rstrip())
            log.error("%s: %s", type(err).__name__, err)
            group[0].done.set_exception(RequestError(500, f"{type(err).__name__}: {err}"))
            return
        lengths = sorted(len(j.ids) for j in group)
        log.info("batch of %d %s request%s, prompts of %d-%d tokens, in %.2f s", len(group),
                 "echo" if group[0].echo_top is not None else "generation", "s" * (len(group) > 1), lengths[0],
                 lengths[-1], time.monotonic() - t)
        for j, r in zip(group, results, strict=True):
            j.done.set_result(r)


class Api:
    """The OpenAI shapes around the batcher."""

    def __init__(self, scorer: Scorer, batcher: Batcher, name: str, lora_request: bool = False) -> None:
        self.scorer, self.batcher, self.name = scorer, batcher, name
        self.lora_request = lora_request  # adapters selected by the body's lora_request (trtllm-serve's way)
        self._lock = threading.Lock()
        self._served = {n: ServedCounts() for n in self.names()}

    def _count(self, adapter: str | None, tokens: int, seconds: float) -> None:
        with self._lock:
            c = self._served[adapter or self.name]
            c.requests += 1
            c.completion_tokens += tokens
            c.seconds += seconds

    def served_stats(self) -> dict[str, Any]:  # JSON edge: GET /v1/adapters
        with self._lock:
            return {"served": {n: {"requests": c.requests, "completion_tokens": c.completion_tokens,
                                   "seconds": round(c.seconds, 6)} for n, c in self._served.items()}}

    def lora_adapter(self, given: object) -> str | None:
        """The adapter a request's lora_request selects (None: the base): the loaded adapter whose folder its
        lora_path is (relative to this server's working folder, as trtllm-serve resolves it)."""
        if given is None:
            return None
        _, _, path = _lora_fields(given)
        wanted = Path(path).resolve()
        for name, folder in self.scorer.adapter_dirs.items():
            if folder == wanted:
                return name
        raise RequestError(400, f"lora_request.lora_path {path!r} is not an adapter this server loaded "
                                f"(lora_config.lora_dir: {', '.join(sorted(self.scorer.adapters)) or 'none'})")

    def names(self) -> list[str]:
        """The model names requests may carry: the served name (the base), then each adapter's."""
        return [self.name, *self.scorer.adapters]

    def speculative_stats(self) -> dict[str, Any]:  # JSON edge: GET /v1/speculative
        s = self.scorer
        if s.draft is None:
            return {"speculative": False}
        st = s.stats
        return {"speculative": True, "max_draft_len": s.max_draft_len, "verified": not s.unverified,
                "requests": st.requests, "drafted": st.drafted, "accepted": st.accepted,
                "acceptance_rate": round(st.accepted / st.drafted, 6) if st.drafted else None}

    def _stopped(self, new: list[int], max_tokens: int) -> bool:
        return bool(new) and (new[-1] in self.scorer.eos or len(new) < max_tokens)

    def chat(self, messages: list[dict[str, Any]],  # JSON edge: the request's OpenAI chat messages
             max_tokens: int, top: int | None, speculative: bool = True,
             stream: bool = False, adapter: str | None = None) -> dict[str, Any]:  # JSON edge: chat response
        s = self.scorer
        ids = s.chat_ids(messages)
        n = len(ids)
        max_tokens = s.fit(n, max_tokens)
        t = time.monotonic()
        res = self.batcher.submit(Job(ids=ids, max_tokens=max_tokens, top=top, speculative=speculative,
                                      adapter=adapter))
        self._count(adapter, len(res.new), time.monotonic() - t)
        content = []
        if top is not None:
            for t, (lp, alts) in zip(res.new, res.gen, strict=False):
                if t in s.special:
                    continue
                item: dict[str, Any] = {"token": s.text(t), "logprob": lp}  # JSON edge: a response logprob entry
                if top:
                    item["top_logprobs"] = [{"token": s.text(i), "logprob": v} for i, v in alts[:top]]
                content.append(item)
        choice: dict[str, Any] = {  # JSON edge: an OpenAI chat choice
            "index": 0, "finish_reason": "stop" if self._stopped(res.new, max_tokens) else "length",
            "message": {"role": "assistant", "content": s.tok.decode(res.new, skip_special_tokens=True)},
            "logprobs": {"content": content} if top is not None else None}
        out: dict[str, Any] = {  # JSON edge: the response
            "object": "chat.completion", "model": adapter or self.name, "choices": [choice],
            "usage": {"prompt_tokens": n, "completion_tokens": len(res.new), "total_tokens": n + len(res.new)}}
        if stream:
            texts = [str(s.tok.decode(res.new[:i], skip_special_tokens=True)) for i in range(len(res.new) + 1)]
            out[STREAM_PIECES] = [b[len(a):] for a, b in itertools.pairwise(texts)]
        return out

    def complete(self, prompt: str | list[int], max_tokens: int, echo: bool,
                 top: int | None, speculative: bool = True,
                 adapter: str | None = None) -> dict[str, Any]:  # JSON edge: completions response
        s = self.scorer
        ids: list[int] = prompt if isinstance(prompt, list) else \
            [int(t) for t in s.tok(prompt, add_special_tokens=False)["input_ids"]]
        if not ids:
            raise RequestError(400, "empty prompt")
        n = len(ids)
        max_tokens = s.fit(n, max_tokens)
        echo_top = top if echo and top is not None else None
        t = time.monotonic()
        res = self.batcher.submit(Job(ids=ids, max_tokens=max_tokens, top=top, echo_top=echo_top,
                                      speculative=speculative, adapter=adapter))
        self._count(adapter, len(res.new), time.monotonic() - t)
        logprobs = None
        if top is not None:
            toks: list[str] = []
            lps: list[float | None] = []
            tops: list[dict[str, float] | None] = []
            if res.prompt is not None:
                toks.append(s.text(ids[0]))
                lps.append(None)
                tops.append(None)
                for t, (lp, alts) in zip(ids[1:], res.prompt, strict=True):
                    toks.append(s.text(t))
                    lps.append(lp)
                    tops.append({s.text(i): v for i, v in alts[:max(top, 1)]})
            for t, (lp, alts) in zip(res.new, res.gen, strict=False):
                toks.append(s.text(t))
                lps.append(lp)
                tops.append({s.text(i): v for i, v in alts[:max(top, 1)]})
            offsets, at = [], 0
            for tx in toks:
                offsets.append(at)
                at += len(tx)
            logprobs = {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
        text = str(s.tok.decode(res.new, skip_special_tokens=True))
        full = (str(s.tok.decode(ids)) if echo else "") + text
        return {"object": "text_completion", "model": adapter or self.name,
                "choices": [{"index": 0, "text": full, "logprobs": logprobs,
                             "finish_reason": "stop" if self._stopped(res.new, max_tokens) else "length"}],
                "usage": {"prompt_tokens": n, "completion_tokens": len(res.new), "total_tokens": n + len(res.new)}}

    def handle(self, path: str, body: Any) -> dict[str, Any]:  # JSON edge: the response body
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        asked = body.get("model")
        if self.lora_request:
            if asked not in (None, self.name):
                raise RequestError(404, f"model '{asked}' is not served here; this server serves '{self.name}' "
                                        "(an adapter is selected by the request's lora_request)")
            adapter = self.lora_adapter(body.get("lora_request"))
        elif asked not in (None, self.name) and asked not in self.scorer.adapters:
            raise RequestError(404, f"model '{asked}' is not served here; this server serves "
                                    f"{', '.join(repr(n) for n in self.names())}")
        else:
            adapter = asked if asked is not None and asked != self.name else None
        if body.get("stream") and path != "/v1/chat/completions":
            raise RequestError(400, "stream is supported for chat completions only")
        speculative = body.get("speculative", True)
        if not isinstance(speculative, bool):
            raise RequestError(400, f"speculative must be true or false, got {speculative!r}")
        if path == "/v1/chat/completions":
            messages: Any = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "messages must be a non-empty list")
            max_tokens = _int_field(body, "max_tokens", 16, 1, 1 << 16) or 16
            want = bool(body.get("logprobs"))
            top = _int_field(body, "top_logprobs", 0, 0, MAX_TOP) if want else None
            return self.chat(messages, max_tokens, top, speculative, stream=bool(body.get("stream")), adapter=adapter)
        if path == "/v1/completions":
            prompt: Any = body.get("prompt")
            ok_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            if not (isinstance(prompt, str) or ok_ids):
                raise RequestError(400, "prompt must be a string or a list of token ids")
            if ok_ids and any(not 0 <= t < self.scorer.vocab for t in prompt):
                raise RequestError(400, f"prompt token ids must be in [0, {self.scorer.vocab})")
            top = _int_field(body, "logprobs", None, 0, MAX_TOP)
            return self.complete(prompt, _int_field(body, "max_tokens", 16, 0, 1 << 16) or 0,
                                 bool(body.get("echo")), top, speculative, adapter)
        raise RequestError(404, f"no route {path}")


def _lora_fields(given: object) -> tuple[str, int, str]:
    """(lora_name, lora_int_id, lora_path) of a request's lora_request, or RequestError 400."""
    if not isinstance(given, dict):
        raise RequestError(400, "lora_request must be an object {lora_name, lora_int_id, lora_path}")
    name, uid, path = given.get("lora_name"), given.get("lora_int_id"), given.get("lora_path")
    if not isinstance(name, str) or not isinstance(path, str) or not path or len(path) > 4096 \
            or not isinstance(uid, int) or isinstance(uid, bool) or uid < 0:
        raise RequestError(400, "lora_request needs lora_name (a string), lora_int_id (an integer ≥ 0) and "
                                "lora_path (the adapter's folder)")
    return name, uid, path


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


class _Handler(BaseHTTPRequestHandler):
    """One request to the scoring server; the `Api` it answers with is the server's."""

    server: ScoringServer

    @property
    def api(self) -> Api:
        return self.server.api

    def log_message(self, fmt: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:  # JSON edge: the response body
        data = json.dumps(payload, allow_nan=False, default=_finite).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, answer: dict[str, Any], pieces: list[str]) -> None:  # JSON edge: the response
        """An answer as server-sent chat chunks, one per token, after it is complete (the batcher generates
        whole answers): a streaming client (AIPerf) gets the right tokens and throughput, but its time to
        first token is the whole answer's latency here."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        choice = answer["choices"][0]
        chunks = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                  *({"index": 0, "delta": {"content": p}, "finish_reason": None} for p in pieces),
                  {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]
        for i, c in enumerate(chunks):
            event: dict[str, Any] = {"id": "chatcmpl-ef", "object": "chat.completion.chunk",  # JSON edge
                                     "model": answer.get("model", self.api.name), "choices": [c]}
            if i == len(chunks) - 1:
                event["usage"] = answer["usage"]
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in self.api.names()]})
        elif self.path == ADAPTERS_PATH:
            self._send(200, self.api.served_stats())
        elif self.path == SPECULATIVE_PATH:
            self._send(200, self.api.speculative_stats())
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
            answer = self.api.handle(self.path, body)
            pieces = answer.pop(STREAM_PIECES, None)
            if pieces is None:
                self._send(200, answer)
            else:
                self._stream(answer, pieces)
        except RequestError as err:
            if err.status >= 500:
                log.error("%s", err)
            self._send(err.status, {"error": {"message": str(err), "code": err.status}})
        except Exception as err:  # a failure outside the model: a 5xx with the cause on the log's last line
            log.error("%s", traceback.format_exc().rstrip())
            log.error("%s: %s", type(err).__name__, err)
            self._send(500, {"error": {"message": f"{type(err).__name__}: {err}", "code": 500}})


class ScoringServer(ThreadingHTTPServer):
    """The scoring server: a thread per request, each answered by `api`."""

    def __init__(self, api: Api, host: str, port: int) -> None:
        self.api = api
        super().__init__((host, port), _Handler)


def make_server(api: Api, host: str, port: int) -> ThreadingHTTPServer:
    return ScoringServer(api, host, port)


def _finite(x: Any) -> Any:
    raise TypeError(f"not JSON: {x!r}")


def clamp(lp: float) -> float:
    """-inf (a token the model rules out) as the lowest finite log-prob OpenAI servers report."""
    return lp if math.isfinite(lp) else -9999.0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--name", help="the `model` requests must carry (default: model_dir as given)")
    ap.add_argument("--max-seq-len", type=int, help="prompt + answer tokens per request, as an engine's limit")
    ap.add_argument("--max-batch", type=int, default=16, help="requests run together at most (default 16)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: OMP_NUM_THREADS, else 1)")
    ap.add_argument("--draft", help="a draft checkpoint with the model's tokenizer: answers by assisted generation")
    ap.add_argument("--max-draft-len", type=int, default=3, help="candidate tokens per step (default 3)")
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                    help="a LoRA adapter (PEFT folder) requests select by `model: NAME` (repeatable)")
    ap.add_argument("--lora-request", action="store_true",
                    help="select adapters by the request's lora_request {lora_name, lora_int_id, lora_path} (the "
                         "lora_path a folder given by --adapter), `model` the served name: trtllm-serve's way")
    ap.add_argument("--ignore-adapters", action="store_true",
                    help="TEST ONLY: answer every request with the base, whatever adapter it asked for (a broken "
                         "adapter path the gate must reject)")
    ap.add_argument("--unverified-draft", action="store_true",
                    help="TEST ONLY: keep the draft's tokens without verification (a broken speculative path the "
                         "gate's lossless rule must reject)")
    return ap


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Path], str]:
    """The parsed command line, its adapters (NAME → folder) and the served model's name; a usage error exits 2."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.max_batch < 1:
        ap.error("--max-batch must be at least 1")
    if args.max_draft_len < 1:
        ap.error("--max-draft-len must be at least 1")
    if args.unverified_draft and not args.draft:
        ap.error("--unverified-draft needs --draft")
    adapters: dict[str, Path] = {}
    for item in args.adapter:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder or name in adapters:
            ap.error(f"--adapter {item!r}: NAME=DIR with a distinct NAME")
        adapters[name] = Path(folder)
    if adapters and args.draft:
        ap.error("--adapter and --draft cannot be combined (assisted generation runs the base alone)")
    if args.ignore_adapters and not adapters:
        ap.error("--ignore-adapters needs --adapter")
    if args.lora_request and not adapters:
        ap.error("--lora-request needs --adapter")
    name = args.name or args.model_dir
    if name in adapters:
        ap.error(f"--adapter {name}: the served model's own name (--name) cannot name an adapter")
    return args, adapters, name


def main(argv: list[str] | None = None) -> int:
    args, adapters, name = _arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import torch

    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    torch.set_num_threads(max(1, threads))
    scorer = Scorer(Path(args.model_dir), device=args.device, max_seq_len=args.max_seq_len,
                    draft_dir=Path(args.draft) if args.draft else None, max_draft_len=args.max_draft_len,
                    unverified=args.unverified_draft, adapters=adapters, ignore_adapters=args.ignore_adapters)
    if args.ignore_adapters:
        log.warning("--ignore-adapters: every request is answered by the base, whatever adapter it asks (test only)")
    if args.unverified_draft:
        log.warning("--unverified-draft: draft tokens are NOT verified; answers are not the model's (test only)")
    batcher = Batcher(scorer, max_batch=args.max_batch)
    server = make_server(Api(scorer, batcher, name, lora_request=args.lora_request), args.host, args.port)
    log.info("serving %s on http://%s:%d (batches of up to %d)", name, args.host, args.port, args.max_batch)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        batcher.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
