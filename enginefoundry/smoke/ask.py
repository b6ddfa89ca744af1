"""Asking the served endpoint: the probe, every prompt at `concurrency`, teacher-forced scoring, the
non-speculative twin, and the per-case evidence the gate judges."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from enginefoundry.errors import InputError, ToolError
from enginefoundry.identity import TOKENIZER_FILES, digest_files, list_files
from enginefoundry.runner import exited_after_error
from enginefoundry.smoke.client import ChatClient, ScoredToken, ServedAnswer
from enginefoundry.smoke.gate import LOSSLESS, CaseEvidence, GateRule, rule_lossless
from enginefoundry.smoke.policy import GatePolicy
from enginefoundry.smoke.prompts import PromptCase, PromptSet
from enginefoundry.smoke.reference import PROGRESS_EVERY_S, ReferenceAnswer
from enginefoundry.smoke.report import SmokeReport
from enginefoundry.smoke.tokens import chat_prompt_ids, text_ids
from enginefoundry.spec import SmokeSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tokenizer_digest(folder: Path) -> str:
    files = [p for p in list_files(folder) if p.name in TOKENIZER_FILES]
    return digest_files(folder, files)[0]

def lossless_rule(base_url: str, model_name: str, spec: SmokeSpec, cases: list[PromptCase],
                  answers: list[ServedAnswer], twin_body: Mapping[str, JsonValue] | None,
                  progress: Callable[[str], None], server_alive: Callable[[], bool] | None) -> GateRule:
    """Every prompt again without speculation (the twin), greedy, the same max_new_tokens: the rule compares."""
    served = [(c.id, a.text, a.finish_reason) for c, a in zip(cases, answers, strict=True)]
    if twin_body is None:
        return rule_lossless(served, None, "the lane's server has no non-speculative switch")
    twin = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens, want_logprobs=False, extra=dict(twin_body))
    t = time.monotonic()
    theirs = ask_all(twin, cases, concurrency=spec.concurrency, progress=progress, server_alive=server_alive)
    rule = rule_lossless(served, [(c.id, a.text, a.finish_reason) for c, a in zip(cases, theirs, strict=True)])
    progress(f"smoke: lossless speculation: {len(cases)} prompts asked without speculation in "
             f"{time.monotonic() - t:.1f} s: {rule.detail}")
    return rule


def twin_answers(base_url: str, model_name: str, spec: SmokeSpec, cases: list[PromptCase],
                 progress: Callable[[str], None],
                 server_alive: Callable[[], bool] | None = None) -> list[tuple[str, str, str | None]]:
    """(case id, text, finish reason) of every prompt asked of a non-speculative twin server (a lane whose own
    server has no request switch serves its twin apart: `Lane.twin_serve_command`), greedy, the same
    max_new_tokens as the unit was asked with."""
    twin = ChatClient(base_url, model_name, max_tokens=spec.max_new_tokens, want_logprobs=False)
    t = time.monotonic()
    theirs = ask_all(twin, cases, concurrency=spec.concurrency, progress=progress, server_alive=server_alive)
    progress(f"smoke: lossless speculation: {len(cases)} prompts asked of the twin server in "
             f"{time.monotonic() - t:.1f} s")
    return [(c.id, a.text, a.finish_reason) for c, a in zip(cases, theirs, strict=True)]


def with_twin_answers(report: SmokeReport, twin: list[tuple[str, str, str | None]]) -> SmokeReport:
    """The report with its rule `lossless speculation` judged again on `twin`'s answers (the one run_smoke wrote
    without a twin to ask, as not run, is replaced)."""
    served = [(c.id, c.served, c.finish_reason) for c in report.cases]
    rules = [r for r in report.verdict.rules if r.name != LOSSLESS]
    verdict = report.verdict.model_copy(update={"rules": rules}).with_rule(rule_lossless(served, twin))
    return report.model_copy(update={"verdict": verdict})

def score_all(client: ChatClient, cases: list[PromptCase], refs: dict[str, ReferenceAnswer],
              tok: PreTrainedTokenizerBase, *,
              concurrency: int, progress: Callable[[str], None]) -> dict[str, list[ScoredToken]]:
    """Teacher forcing: each reference answer scored under the served model (ChatClient.score), `concurrency` at a
    time, after one probe request says whether the endpoint returns prompt log-probs at all."""
    todo = [(c, refs[c.id]) for c in cases if refs[c.id].token_ids and refs[c.id].token_logprobs]
    if not todo:
        return {}

    def one(item: tuple[PromptCase, ReferenceAnswer]) -> tuple[str, list[ScoredToken] | None]:
        case, ref = item
        return case.id, client.score(case.id, chat_prompt_ids(tok, case.chat()), ref.token_ids)

    t = last = time.monotonic()
    first = one(todo[0])
    if first[1] is None:
        return {}
    scored = {first[0]: first[1]}
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="score") as pool:
        for i, (cid, got) in enumerate(pool.map(one, todo[1:]), 2):
            if got is not None:
                scored[cid] = got
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S and i < len(todo):
                last = now
                progress(f"smoke: {i}/{len(todo)} reference answers scored ({now - t:.0f} s, about "
                         f"{(now - t) / i * (len(todo) - i):.0f} s left)")
    progress(f"smoke: {len(scored)} reference answers scored under the served model in "
             f"{time.monotonic() - t:.1f} s")
    return scored


def check_prompt_count(prompts: PromptSet, policy: GatePolicy, small_sample: str, precision: str) -> None:
    """Refuse, before any endpoint or reference work, a prompt set with fewer graded prompts than the policy of
    this precision needs (its sample-size rule would reject every unit, healthy or not)."""
    graded = sum(c.expected is not None for c in prompts.cases)
    need = policy.min_samples
    if graded >= need or small_sample == "warn":
        return
    raise InputError(
        f"smoke.prompts: {prompts.path} has {graded} graded prompts (with an expected answer); the "
        f"{policy.family.value} policy of precision {precision} needs at least {need} (margin "
        f"{policy.accuracy_margin}, α {policy.alpha}, power {policy.power} at discordance "
        f"{policy.expected_discordance}): add {need - graded} graded prompts, or set smoke.small_sample: warn "
        "(--small-sample warn) to judge with a warning")


def probe(client: ChatClient, cases: list[PromptCase], server_alive: Callable[[], bool] | None,
           progress: Callable[[str], None]) -> None:
    t = time.monotonic()
    try:
        answer = client.probe(cases[0])
    except ToolError as err:
        if server_alive is not None and exited_after_error(server_alive):
            raise ToolError(f"smoke: the server died before the smoke test: 0/{len(cases)} prompts answered, "
                            f"no answer for '{cases[0].id}'") from None
        raise ToolError(f"{str(err).splitlines()[0]} (0/{len(cases)} prompts answered; checked before any "
                        "reference work)") from None
    said = f"answered HTTP error {answer.refused[:120]}" if answer.refused else "answers"
    progress(f"smoke: endpoint {client.base_url} {said} ({time.monotonic() - t:.1f} s)")


def ask_all(client: ChatClient, cases: list[PromptCase], *, concurrency: int, progress: Callable[[str], None],
            server_alive: Callable[[], bool] | None = None) -> list[ServedAnswer]:
    """Every prompt, `concurrency` requests in flight (a batching server answers them together); answers in
    prompt order. The first prompt the endpoint cannot answer at all stops the run (ToolError, one line)."""
    answers: list[ServedAnswer | None] = [None] * len(cases)
    done = 0
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="smoke")
    try:
        futures = {pool.submit(client.answer, case): i for i, case in enumerate(cases)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                answers[i] = fut.result()
            except ToolError as err:
                if server_alive is not None and exited_after_error(server_alive):
                    raise ToolError(f"smoke: the server died during the smoke test: {done}/{len(cases)} prompts "
                                    f"answered, no answer for '{cases[i].id}'") from None
                raise ToolError(f"{str(err).splitlines()[0]} ({done}/{len(cases)} prompts answered)") from None
            done += 1
            if done % 25 == 0:
                progress(f"smoke: {done}/{len(cases)} prompts answered")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [a for a in answers if a is not None]


def case_evidence(case: PromptCase, answer: ServedAnswer, ref: ReferenceAnswer,
                  tok: PreTrainedTokenizerBase) -> CaseEvidence:
    graded = case.expected is not None
    # Both texts through the same tokenisation path (the reference tokenizer), so that a served answer
    # equal to the reference's text always agrees token for token.
    return CaseEvidence(
        id=case.id, served=answer.text, reference=ref.text,
        served_ids=text_ids(tok, answer.text),
        reference_ids=text_ids(tok, ref.text),
        served_correct=case.is_correct(answer.text) if graded and answer.refused is None else
        (False if graded else None),
        reference_correct=case.is_correct(ref.text), served_finish=answer.finish_reason,
        reference_finish=ref.finish, served_completion_tokens=answer.completion_tokens,
        served_prompt_tokens=answer.prompt_tokens, reference_prompt_tokens=ref.prompt_tokens,
        refused=answer.refused, server_error=answer.server_error, slice=case.slice,
    )


# An exception's last line in a Python server's log ("ValueError: Cannot use chat template …"), or an ERROR line.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)\b.*|.*\bERROR\b.*)$")


def last_error_line(log: Path | None, *, tail_bytes: int = 65536) -> str | None:
    """The last exception or ERROR line in the server's log (its own words for a 5xx), None without one."""
    if log is None or not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - tail_bytes))
        lines = f.read().decode(errors="replace").splitlines()
    hits = [ln.strip() for ln in lines if _ERROR_LINE.match(ln.rstrip())]  # at column 0, not traceback code
    return hits[-1] if hits else None


def served_as_reference(case_id: str, answer: ServedAnswer, tok: PreTrainedTokenizerBase) -> ReferenceAnswer:
    """One served answer in the reference's form (ids from the reference tokenizer, the server's token texts and
    log-probs where it returned them), so that a sibling's answers judge other units like a reference's."""
    lps = answer.logprobs or []
    return ReferenceAnswer(id=case_id, text=answer.text, token_ids=text_ids(tok, answer.text),
        token_texts=[t.token for t in lps], token_logprobs=[t.logprob for t in lps],
        finish="stop" if answer.finish_reason == "stop" else "length", prompt_tokens=answer.prompt_tokens)


