#!/usr/bin/env python3
"""The promotion rule's error rates on this host (issue 33 §2). A benchmark.

    .venv/bin/python benchmarks/rollout_noise.py [--repeats 8] [--gain-repeats 4] [--rounds 3] [--load 0] \
        [--json-out FILE]

Serves the tiny model (tests/fixtures/tiny-chat/model) twice with the reference lane's own serve command, as two
units A and B, and measures them side by side as a rollout does (rollout/side_by_side.py: alternating rounds in
ABBA order, AIPerf at the spec's c=4 point of configs/tiny-cpu.yaml, its request count), then asks the shipped
promotion rule (records/promotion.compare, the candidate a rebuild of the champion's weights: the strictest case)
for its decision:

  * same unit (`--repeats` comparisons): B is A. The right answer is "inconclusive: the difference is within
    noise". A promotion is a false promotion; a hold as a regression is a false hold.
  * a real ×2 (`--gain-repeats` comparisons): the champion A is measured through a proxy that replays its server's
    stream `--slowdown` times slower (HalfSpeed; 3 gives about half the measured output tok/s here: the benchmark
    client's own time per request is about the server's on this loaded host, so a replay at half pace gave only
    ×1.2–×1.5); the candidate B is its server itself. The measured ratio of means is printed. The right answer is
    promote; anything else is a false hold.

For contrast, the rule before issue 33 (one sample each: the first round's, ratio ≥ 0.9 and TTFT ≤ 1.25×, no
interval) is applied to the same measurements. `--load N` starts N busy processes for the whole run (the host's
own load from other work counts too: it is printed). Prints one row per comparison and the rates.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import Process
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from enginefoundry.bench.aiperf import run_point  # noqa: E402
from enginefoundry.bench.noise import Role, SideBySide, Trial  # noqa: E402
from enginefoundry.lanes import get_lane  # noqa: E402
from enginefoundry.model_server import Endpoint, free_port, start_server, stop_server  # noqa: E402
from enginefoundry.records.promotion import PromotionPolicy, compare  # noqa: E402
from enginefoundry.spec import load_spec  # noqa: E402
from enginefoundry.store.manifest import Manifest  # noqa: E402
from enginefoundry.store.unit_status import UnitStatus  # noqa: E402

MODEL = REPO / "tests" / "fixtures" / "tiny-chat" / "model"


def bundle(root: Path) -> Path:
    """A reference-lane bundle of the tiny model (what its build leaves: bundle.json and model/)."""
    folder = root / "bundle"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "model").exists():
        (folder / "model").symlink_to(MODEL)
    (folder / "bundle.json").write_text(json.dumps({"params": {"device": "cpu"}}))
    return folder


class HalfSpeed(ThreadingHTTPServer):
    """The champion's endpoint at half speed: a proxy that replays the server's response stream at half its pace (a
    chunk the server sent t seconds after the request reaches the client 2t seconds after it; a reader thread
    timestamps each chunk as it arrives). At a fixed concurrency every request then takes twice as long: half the
    output rate where, as here, the benchmark client and not the server bounds the throughput. (Stopping the
    server's process half of the time changed nothing measurable: on this loaded 2-core host AIPerf itself is the
    bottleneck, and the tiny model's server idles between its requests.)"""

    daemon_threads = True

    def __init__(self, upstream: int, factor: float = 2.0) -> None:
        self.upstream, self.factor = upstream, factor
        super().__init__(("127.0.0.1", free_port()), _Replay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no re-framing of chunks

    def log_message(self, format: str, *args: object) -> None:
        return

    def _forward(self) -> None:
        server: HalfSpeed = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        upstream = http.client.HTTPConnection("127.0.0.1", server.upstream, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        started = time.monotonic()
        upstream.request(self.command, self.path, body=body or None, headers=headers)
        response = upstream.getresponse()
        chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def read() -> None:
            while chunk := response.read1(65536):
                chunks.put((time.monotonic(), chunk))
            chunks.put((time.monotonic(), b""))

        threading.Thread(target=read, daemon=True).start()
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.end_headers()
        while True:
            arrived, chunk = chunks.get()
            time.sleep(max(0.0, started + server.factor * (arrived - started) - time.monotonic()))
            if not chunk:
                break
            self.wfile.write(chunk)
            self.wfile.flush()
        upstream.close()

    do_GET = _forward
    do_POST = _forward


def _busy() -> None:
    while True:
        pass


def side_by_side(endpoints: dict[str, Endpoint], rounds: int, out: Path, slow: HalfSpeed | None) -> SideBySide:
    """`slow`: the champion is measured through it (a real ×2 between the two)."""
    spec = load_spec(REPO / "configs" / "tiny-cpu.yaml")
    scenario, concurrency = spec.benchmark.scenarios[0], max(spec.benchmark.concurrency)
    trials = []
    for r in range(rounds):
        order: tuple[Role, Role] = ("champion", "candidate") if r % 2 == 0 else ("candidate", "champion")
        for role in order:
            ep = endpoints[role]
            url = slow.url if slow is not None and role == "champion" else ep.base_url
            point, _ = run_point(spec.benchmark, scenario, concurrency, url=url, model=ep.model_name,
                                 tokenizer=ep.tokenizer_dir, out=out / f"r{r}-{role}", progress=lambda _: None)
            trials.append(Trial(role=role, round=r, output_tokens_per_s=point.output_tokens_per_s,
                                ttft_ms_p95=point.ttft_ms.p95, valid=point.valid))
    return SideBySide(stem="cpu", scenario=scenario.name, concurrency=concurrency, champion_version="A",
                      candidate_version="B", trials=trials)


def manifest() -> Manifest:
    return Manifest.model_validate(dict(
        key="k", key_components={"weights_digest": "w" * 64, "tokenizer_digest": "t" * 64}, model="m",
        unit="fp32-tp1.chat.cpu", lane="reference", target={}, variant={}, profile={}, source={}, files=[],
        status=UnitStatus.CANDIDATE, smoke={"smoke_agreement": 1.0}, benchmark={}))


def decision(measured: SideBySide, policy: PromotionPolicy) -> str:
    verdict = compare(manifest(), manifest(), policy, measured)
    return "promoted" if verdict.promote else "inconclusive" if verdict.inconclusive else "held"


def old_rule(measured: SideBySide, policy: PromotionPolicy) -> str:
    """Before issue 33: one sample each (the first round's), the bounds on the point ratio."""
    first = {t.role: t for t in measured.trials if t.round == 0}
    a, b = first["champion"], first["candidate"]
    if not (a.output_tokens_per_s and b.output_tokens_per_s and a.ttft_ms_p95 and b.ttft_ms_p95):
        return "held"
    ok = (b.output_tokens_per_s / a.output_tokens_per_s >= policy.min_throughput_ratio
          and b.ttft_ms_p95 / a.ttft_ms_p95 <= policy.max_ttft_p95_factor)
    return "promoted" if ok else "held"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8, help="same-unit comparisons")
    parser.add_argument("--gain-repeats", type=int, default=4, help="×2 comparisons")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=0, help="busy processes started for the run")
    parser.add_argument("--slowdown", type=float, default=3.0,
                        help="the ×2 case: the champion's stream replayed this many times slower (3: about half the "
                             "throughput here, where the client's own time per request is about the server's)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    policy = PromotionPolicy(comparison_rounds=args.rounds)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="ef-rollout-noise-"))
    lane, folder = get_lane("reference"), bundle(work)
    hogs = [Process(target=_busy, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    endpoints: dict[str, Endpoint] = {}
    rows = []
    try:
        for role in ("champion", "candidate"):
            cmd = lane.named_serve_command(folder, "127.0.0.1", free_port(), "tiny-chat")
            endpoints[role] = start_server(cmd, work / role / "server.log")  # a serve-cwd each, beside its log
        slow = HalfSpeed(int(endpoints["champion"].base_url.rsplit(":", 1)[1]), args.slowdown)
        threading.Thread(target=slow.serve_forever, daemon=True).start()
        cases: list[tuple[str, HalfSpeed | None]] = [("same unit", None)] * args.repeats + [("×2", slow)] * \
            args.gain_repeats
        for i, (case, throttle) in enumerate(cases):
            t0 = time.monotonic()
            measured = side_by_side(endpoints, args.rounds, work / f"c{i}", throttle)
            tok_old, tok_new = measured.pairs("output_tokens_per_s")
            row: dict[str, Any] = {
                "case": case, "rule": decision(measured, policy), "old rule": old_rule(measured, policy),
                   "champion tok/s": [round(v, 1) for v in tok_old], "candidate tok/s": [round(v, 1) for v in tok_new],
                   "loadavg": round(os.getloadavg()[0], 2), "seconds": round(time.monotonic() - t0, 1)}
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
        slow.shutdown()
    finally:
        for e in endpoints.values():
            stop_server(e.pid)
        for h in hogs:
            h.terminate()
        shutil.rmtree(work, ignore_errors=True)  # the bundle link and AIPerf's exports: the rows are printed
    same = [r for r in rows if r["case"] == "same unit"]
    gain = [r for r in rows if r["case"] == "×2"]

    def rate(rs: list[dict[str, Any]], key: str, value: str) -> str:
        return f"{sum(r[key] == value for r in rs)}/{len(rs)}"

    summary = {
        "rounds": args.rounds, "load": args.load, "cpus": os.cpu_count(), "slowdown": args.slowdown,
        "×2: measured candidate/champion (ratio of means)": [
            round(sum(r["candidate tok/s"]) / sum(r["champion tok/s"]), 2) for r in gain],
        "same unit: false promotion (new rule)": rate(same, "rule", "promoted"),
        "same unit: false hold as regression (new rule)": rate(same, "rule", "held"),
        "same unit: inconclusive, within noise (new rule, right)": rate(same, "rule", "inconclusive"),
        "×2: promoted (new rule, right)": rate(gain, "rule", "promoted"),
        "×2: false hold or inconclusive (new rule)": f"{sum(r['rule'] != 'promoted' for r in gain)}/{len(gain)}",
        "same unit: promoted (old rule, one sample)": rate(same, "old rule", "promoted"),
        "same unit: held as regression (old rule)": rate(same, "old rule", "held"),
        "×2: promoted (old rule)": rate(gain, "old rule", "promoted"),
    }
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
