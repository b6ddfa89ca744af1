"""Issue 34: inputs a signed build reuses from the store are proven by a trusted signature over their digest, or
computed again (enginefoundry/evidence/inputs.py, smoke/reference.py). A file:// store in a temporary folder and a
fake reference computation: milliseconds, no process."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from enginefoundry.evidence.inputs import InputTrust
from enginefoundry.evidence.signing import KeyPairSigner, TrustedKey, keygen
from enginefoundry.smoke.logprobs import LogprobSpread
from enginefoundry.smoke.prompts import PromptCase
from enginefoundry.smoke.reference import (
    ReferenceAnswer,
    ReferenceAsk,
    ReferenceSet,
    ReferenceSettings,
    load_or_compute_reference,
    load_or_compute_spread,
    load_sibling_reference,
    publish_sibling_reference,
    reference_key,
    spread_store_key,
    store_key,
)
from enginefoundry.store.backends import FileStore
from enginefoundry.store.layout import blob_key

CASES = [PromptCase(id="a", prompt="1+1?"), PromptCase(id="b", prompt="2+2?")]


def _signer(tmp: Path, name: str) -> KeyPairSigner:
    key, _ = keygen(tmp / "keys" / name)
    return KeyPairSigner(key.read_bytes(), name=name)


def _trust(signer: KeyPairSigner | None, *trusted: KeyPairSigner) -> InputTrust:
    keys = [TrustedKey(name=s.identity.split(" (")[0], public_key=s.public_pem() or "")
            for s in (trusted or ([signer] if signer else []))]
    return InputTrust(signer, keys)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _answers(text: str) -> list[ReferenceAnswer]:
    return [ReferenceAnswer(id=c.id, text=text, token_ids=[1]) for c in CASES]


def _compute(text: str, calls: list[int]):
    def compute(*_args, **_kw) -> list[ReferenceAnswer]:
        calls.append(1)
        return _answers(text)
    return compute


def _load(model: Path, store: FileStore, cache: Path, trust: InputTrust | None, calls: list[int], text: str = "4"):
    settings = ReferenceSettings(store=store, cache_dir=cache, trust=trust, progress=lambda _: None)
    return load_or_compute_reference(model, ReferenceAsk(CASES, 4), settings, dtype="fp32",
                                     compute=_compute(text, calls))


def _forge(store: FileStore, model: Path, text: str = "forged") -> bytes:
    """What a writer of the store does: publish (or replace) the answers of the key."""
    key = reference_key(model, CASES, dtype="fp32", max_new_tokens=4)
    data = json.dumps(ReferenceSet(key=key, answers=_answers(text)).model_dump(mode="json"), sort_keys=True).encode()
    path = store.root / store_key(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return data


def test_a_statement_proves_its_digest_only_under_a_trusted_key(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    ci, stranger = _signer(tmp_path, "ci"), _signer(tmp_path, "stranger")
    _trust(ci).attest(store, "reference", "k" * 64, "1" * 64, "u")
    _trust(stranger).attest(store, "reference", "k" * 64, "2" * 64, "u")
    assert _trust(ci).proven(store, "reference", "k" * 64) == {"1" * 64: ci.identity}
    assert _trust(None, ci, stranger).proven(store, "reference", "k" * 64) == {"1" * 64: ci.identity,
                                                                              "2" * 64: stranger.identity}
    # Another key or kind of input is not proven by it.
    assert _trust(ci).proven(store, "reference", "j" * 64) == {}
    assert _trust(ci).proven(store, "spread", "k" * 64) == {}


def test_a_replaced_or_forged_statement_proves_nothing(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    ci, stranger = _signer(tmp_path, "ci"), _signer(tmp_path, "stranger")
    _trust(ci).attest(store, "converted-checkpoint", "k" * 64, "1" * 64)
    (name,) = store.list("input-attestations/")
    doc = json.loads(store.read_bytes(name))
    # A writer replaces the statement in place with one for another digest (signed by a key of its own) …
    _trust(stranger).attest(store, "converted-checkpoint", "k" * 64, "2" * 64)
    other = next(n for n in store.list("input-attestations/") if n != name)
    (store.root / name).unlink()
    (store.root / name).write_bytes(store.read_bytes(other))
    assert _trust(ci).proven(store, "converted-checkpoint", "k" * 64) == {}
    # … or files a statement signed by the stranger under the trusted key's id.
    forged = name.rsplit("/", 1)[0] + "/" + other.rsplit("/", 1)[1]
    (store.root / forged).write_bytes(store.read_bytes(other))
    assert _trust(ci).proven(store, "converted-checkpoint", "k" * 64) == {}
    assert doc["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"


def test_a_statement_made_after_the_key_expired_proves_nothing(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    ci = _signer(tmp_path, "ci")
    _trust(ci).attest(store, "reference", "k" * 64, "1" * 64)
    expired = TrustedKey(name="ci", public_key=ci.public_pem() or "",
                         expires_at=datetime.now(UTC) - timedelta(days=1))
    assert InputTrust(ci, [expired]).proven(store, "reference", "k" * 64) == {}


def test_a_signing_run_refuses_forged_answers_and_computes_them_again(tmp_path, model):
    store = FileStore(str(tmp_path / "store"))
    forged = _forge(store, model)
    ci = _signer(tmp_path, "ci")
    calls: list[int] = []
    trust = _trust(ci)
    ref, outcome = _load(model, store, tmp_path / "cache", trust, calls)
    assert calls == [1] and outcome.source == "computed" and {a.text for a in ref.answers} == {"4"}
    assert any("not signed by a trusted key" in r for r in trust.refusals)
    (used,) = trust.consumed
    assert used.kind == "reference" and used.origin == "computed" and used.key == outcome.key
    # The forged document stays where the writer put it (published bytes never change); the computed one is
    # stored under its digest, and its digest signed.
    assert (store.root / store_key(ref.key)).read_bytes() == forged
    assert store.exists(blob_key(used.sha256))

    # The next signing run (another worker: an empty cache) reuses the signed answers, computing nothing.
    again = _trust(ci)
    ref2, outcome2 = _load(model, store, tmp_path / "cache2", again, calls)
    assert calls == [1] and outcome2.source == "store" and {a.text for a in ref2.answers} == {"4"}
    assert again.consumed[0].sha256 == used.sha256 and again.consumed[0].proven_by == ci.identity


def test_a_local_cache_filled_from_the_store_is_not_trusted_by_a_signing_run(tmp_path, model):
    store = FileStore(str(tmp_path / "store"))
    _forge(store, model)
    calls: list[int] = []
    unsigned = InputTrust()
    ref, _ = _load(model, store, tmp_path / "cache", unsigned, calls)  # an unsigned run uses the store's, as before
    assert calls == [] and {a.text for a in ref.answers} == {"forged"}
    assert unsigned.consumed[0].origin == "store" and unsigned.consumed[0].proven_by == ""
    ref, outcome = _load(model, store, tmp_path / "cache", _trust(_signer(tmp_path, "ci")), calls)
    assert calls == [1] and outcome.source == "computed" and {a.text for a in ref.answers} == {"4"}


def test_answers_signed_by_a_key_the_run_does_not_trust_are_computed_again(tmp_path, model):
    store = FileStore(str(tmp_path / "store"))
    calls: list[int] = []
    _load(model, store, tmp_path / "cache", _trust(_signer(tmp_path, "stranger")), calls, text="forged")
    _load(model, store, tmp_path / "cache2", _trust(_signer(tmp_path, "ci")), calls)
    assert calls == [1, 1]


def _spread(key: str, margin: float) -> LogprobSpread:
    return LogprobSpread(reference_key=key, precision="fp32", computation_a="a", computation_b="b", prompts=2,
                         tokens=2, mean_abs_diff=0.0, p95_prompt_mean_abs_diff=0.0, top1_disagreement=0.0,
                         margin_logprob=margin)


def test_a_signing_run_measures_a_forged_spread_again(tmp_path, model, monkeypatch):
    import enginefoundry.smoke.reference as reference

    store = FileStore(str(tmp_path / "store"))
    ci = _signer(tmp_path, "ci")
    ref, outcome = _load(model, store, tmp_path / "cache", _trust(ci), [])
    skey = spread_store_key(ref.key)
    (store.root / skey).write_text(_spread(outcome.key, margin=5.0).model_dump_json())  # loose bounds, unsigned
    measured: list[int] = []
    monkeypatch.setattr(reference, "compute_spread",
                        lambda *_a, **_k: measured.append(1) or _spread(outcome.key, margin=0.02))
    trust = _trust(ci)
    spread = load_or_compute_spread(model, CASES, ref, store=store, cache_dir=tmp_path / "cache",
                                    progress=lambda _: None, trust=trust)
    assert measured == [1] and spread.margin_logprob == 0.02
    assert trust.consumed[0].kind == "spread" and trust.consumed[0].origin == "computed"
    # Signed now: the next signing run reuses it; an unsigned one still reads the store's document.
    again = _trust(ci)
    spread = load_or_compute_spread(model, CASES, ref, store=store, cache_dir=tmp_path / "fresh",
                                    progress=lambda _: None, trust=again)
    assert measured == [1] and spread.margin_logprob == 0.02 and again.consumed[0].proven_by == ci.identity


def test_a_forged_sibling_reference_is_refused_by_a_signing_run(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    ci = _signer(tmp_path, "ci")
    publish_sibling_reference(_answers("4"), unit="fp32", unit_key="s" * 64, cases=CASES, max_new_tokens=4,
                              store=store, cache_dir=tmp_path / "c1", trust=_trust(ci))
    found = load_sibling_reference("fp32", "s" * 64, ReferenceAsk(CASES, 4),
                                   ReferenceSettings(store=store, cache_dir=tmp_path / "c2", trust=_trust(ci)),
                                   dtype="fp32", model_dir=tmp_path)
    assert found is not None and {a.text for a in found[0].answers} == {"4"}
    # A writer replaces the published answers (and removes the signed copy): a signing run finds none it can
    # use, and says why; an unsigned run takes the writer's.
    (name,) = store.list("references/")
    doc = json.loads(store.read_bytes(name))
    (store.root / name).unlink()
    (store.root / name).write_text(json.dumps({**doc, "answers": [a.model_dump() for a in _answers("forged")]}))
    for digest in _trust(ci).proven(store, "sibling-reference", found[1].key):
        (store.root / blob_key(digest)).unlink()
    trust = _trust(ci)
    assert load_sibling_reference("fp32", "s" * 64, ReferenceAsk(CASES, 4),
                                  ReferenceSettings(store=store, cache_dir=tmp_path / "c3", trust=trust),
                                  dtype="fp32", model_dir=tmp_path) is None
    assert trust.refusals and "not signed by a trusted key" in trust.refusals[-1]
    unsigned = load_sibling_reference("fp32", "s" * 64, ReferenceAsk(CASES, 4),
                                      ReferenceSettings(store=store, cache_dir=tmp_path / "c4", trust=InputTrust()),
                                      dtype="fp32", model_dir=tmp_path)
    assert unsigned is not None and {a.text for a in unsigned[0].answers} == {"forged"}
