"""Predict serving configurations from a checkpoint's config.json: one interface, one real implementation on
AIConfigurator (`aiconfigurator` 0.12.0, run from its own venv as a subprocess; docs/search.md says why this
distribution and not `aisimulate`).

Evidence (aiconfigurator 0.12.0 / aiconfigurator-core 0.12.0 as installed from the package index):
* `aiconfigurator cli exp --yaml-path Y --save-dir D --top-n N`: one experiment per top-level YAML key, flat V2
  schema (aiconfigurator/cli/example.yaml: serving_mode, model_path, system_name, backend_name, backend_version,
  isl, osl, ttft, tpot, total_gpus, gemm_quant_mode, kvcache_quant_mode, fmha_quant_mode);
* results: `D/<run>/<experiment>/best_config_topn.csv` (columns concurrency, bs, ttft, tpot, tokens/s/gpu,
  tokens/s/user, tp, pp, dp, moe_tp, moe_ep, version, system, power_w: ColumnsAgg in
  aiconfigurator_core/sdk/common.py) and `pareto.csv` beside it;
* disaggregated serving (`serving_mode: disagg`, aiconfigurator/cli/example.yaml `disagg_full`: prefill_* and
  decode_* keys per role, `total_gpus`): `best_config_topn.csv` with the ColumnsDisagg columns ((p)workers, (p)tp,
  (p)pp, (p)dp, (p)moe_tp, (p)moe_ep, (p)bs, the same for (d), num_total_gpus, concurrency, ttft, tpot,
  tokens/s/gpu, tokens/s/user, power_w; aiconfigurator_core/sdk/common.py);
* systems and perf-database versions: `aiconfigurator_core.sdk.perf_database.get_supported_databases()`
  (system → backend → versions); GEMM quant modes: `aiconfigurator_core.sdk.common.GEMMQuantMode`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from enginefoundry.catalog import gpu_targets as gpu_catalog
from enginefoundry.errors import ToolError
from enginefoundry.runner import run_tool
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.spec import BuildSpec, Precision, SearchSpec, Target
from enginefoundry.spec.search import Disagg, Worker

REPO = Path(__file__).resolve().parents[2]
PREDICT_VENV = REPO / ".venv-predict"
CACHE_FORMAT = 1
CACHE_MAX_BYTES = 1 << 20  # a cached prediction is a few KiB

# Lanes → the predictor backend whose database models them.
BACKEND_OF_LANE = {"trtllm": "trtllm", "trtllm-engine": "trtllm", "reference": "trtllm"}



class ProbeResult(TypedDict):
    """What `_PROBE` prints: the package version, its perf databases and each one's default version slot."""

    version: str
    databases: dict[str, dict[str, list[str]]]  # system → backend → versions
    current: dict[str, dict[str, str | None]]  # system → backend → the default version


class Experiment(TypedDict):
    """One `cli exp` experiment, in AIConfigurator 0.12.0's flat V2 schema (aiconfigurator/cli/example.yaml)."""

    serving_mode: str
    model_path: str
    system_name: str
    backend_name: str
    backend_version: str
    isl: int
    osl: int
    ttft: float
    tpot: float
    total_gpus: int
    gemm_quant_mode: str
    agg_tp_candidates: list[int]
    agg_pp_candidates: list[int]
    request_latency: NotRequired[float]


class DisaggExperiment(TypedDict):
    """One disaggregated `cli exp` experiment (AIConfigurator 0.12.0 flat V2 schema, aiconfigurator/cli/example.yaml
    `disagg_full`: the workload and SLO shared, model, system, backend and quant mode per role)."""

    serving_mode: str
    isl: int
    osl: int
    ttft: float
    tpot: float
    total_gpus: int
    prefill_model_path: str
    prefill_system_name: str
    prefill_backend_name: str
    prefill_backend_version: str
    prefill_gemm_quant_mode: str
    decode_model_path: str
    decode_system_name: str
    decode_backend_name: str
    decode_backend_version: str
    decode_gemm_quant_mode: str
    request_latency: NotRequired[float]


class Predicted(BaseModel):
    """One predicted configuration (one replica of tp × pp GPUs) at the SLO."""

    model_config = ConfigDict(frozen=True)

    precision: Precision
    tp: int
    pp: int
    batch_size: int
    # A mixture-of-experts configuration (AIConfigurator's ColumnsAgg dp, moe_tp, moe_ep; 1 for a dense model):
    # attention data parallelism and the MoE layers' tensor and expert parallelism.
    dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    concurrency: int  # per replica
    tokens_per_s_gpu: float
    tokens_per_s_user: float
    ttft_ms: float
    tpot_ms: float
    power_w: float | None = None
    disagg: Disagg | None = None  # a disaggregated configuration (then tp … moe_ep are its decode workers')

    @property
    def gpus(self) -> int:
        """GPUs of one replica: tp × pp × dp (AIConfigurator's gpus/worker, cli/report_and_save.py); a disaggregated
        replica's prefill and decode workers together."""
        return self.disagg.gpus if self.disagg else self.tp * self.pp * self.dp

    def label(self) -> str:
        """The configuration as the search table shows it."""
        if self.disagg:
            return (f"{self.precision.value} disagg P {self.disagg.prefill.label()} + "
                    f"D {self.disagg.decode.label()}")
        return f"{self.precision.value} tp{self.tp}pp{self.pp} bs{self.batch_size}"

    @property
    def tp_pp_only(self) -> bool:
        """Whether a variant (precision × tp × pp) is this configuration: no attention DP, MoE layers sharded like
        the rest (moe_tp = tp, moe_ep = 1)."""
        return self.dp == 1 and self.moe_ep == 1 and self.moe_tp in (1, self.tp)

    def moe_label(self) -> str:
        return f"tp{self.tp}pp{self.pp}dp{self.dp} etp{self.moe_tp}ep{self.moe_ep}"

    def figures(self) -> dict[str, float]:
        out = {"tokens_per_s_gpu": self.tokens_per_s_gpu, "tokens_per_s_user": self.tokens_per_s_user,
               "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "concurrency": float(self.concurrency)}
        if self.power_w:
            out["power_w"] = self.power_w
        return out


class Prediction(BaseModel):
    """The predictor's answer for one (target, precision): ranked configurations and its Pareto front."""

    key: str
    precision: Precision
    ranked: list[Predicted]
    pareto: list[tuple[float, float]]  # (tokens/s/user, tokens/s/gpu)
    problem: str = ""  # why there is no configuration (e.g. the SLO cannot be met, no data for the quant mode)
    disagg: bool = False  # from the predictor's disaggregated search
    cached: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Coverage:
    """Whether the predictor covers a target, and with what: the system, backend and database version."""

    covered: bool
    reason: str = ""  # why not, when not
    system: str = ""
    backend: str = ""
    db_version: str = ""
    note: str = ""  # a disagreement (toolchain ≠ database, lane ≠ backend), shown, never hidden

    def label(self, tool: str) -> str:
        return f"{tool} {self.system} {self.backend} {self.db_version}"


@dataclass(frozen=True)
class Request:
    """One prediction to make: everything its result depends on (the cache key is its digest)."""

    target: str
    precision: Precision
    coverage: Coverage
    config_digest: str
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    total_gpus: int
    max_gpus_per_replica: int
    e2e_ms: float | None = None  # search.slo.e2e_p95_ms → the experiment's `request_latency`
    disagg: bool = False  # serving_mode disagg: prefill and decode workers (search.disaggregated)

    def key(self, tool_version: str) -> str:
        body: dict[str, object] = {"format": CACHE_FORMAT, "tool": tool_version, "config": self.config_digest,
                "system": self.coverage.system, "backend": self.coverage.backend, "db": self.coverage.db_version,
                "precision": self.precision.value, "isl": self.isl, "osl": self.osl, "ttft": self.ttft_ms,
                "tpot": self.tpot_ms, "gpus": self.total_gpus, "per_replica": self.max_gpus_per_replica}
        if self.e2e_ms is not None:
            body["e2e"] = self.e2e_ms
        if self.disagg:  # only then: the aggregated requests keep their cache keys
            body["mode"] = "disagg"
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class Predictor(Protocol):
    name: str

    def coverage(self, spec: BuildSpec, target: Target, model_config: HfModelConfig | None) -> Coverage: ...

    def predict(self, model_config: HfModelConfig, requests: list[Request],
                progress: Callable[[str], None] = print) -> list[Prediction]: ...


def find_tool() -> Path | None:
    """$EF_PREDICTOR (an `aiconfigurator` executable), else `.venv-predict/bin/aiconfigurator` (`make predict-venv`),
    else one on PATH."""
    env = os.environ.get("EF_PREDICTOR")
    if env:
        return Path(env) if Path(env).is_file() else None
    local = PREDICT_VENV / "bin" / "aiconfigurator"
    if local.is_file():
        return local
    found = shutil.which("aiconfigurator")
    return Path(found) if found else None


_PROBE = """
import json, importlib.metadata as m
from aiconfigurator_core.sdk.perf_database import get_supported_databases, get_version_slots
dbs = get_supported_databases()
print(json.dumps({"version": m.version("aiconfigurator"),
                  "databases": {s: {b: sorted(v) for b, v in d.items()} for s, d in dbs.items()},
                  "current": {s: {b: (get_version_slots(s, b) or {}).get("current") for b in d}
                              for s, d in dbs.items()}}))
"""


@lru_cache(maxsize=4)
def probe(tool: Path) -> ProbeResult:
    """The installed predictor's version and its databases (system → backend → versions), from its own venv."""
    python = tool.parent / "python"
    if not python.is_file():
        python = Path(sys.executable)
    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=300,
                          env=_quiet_env())
    if done.returncode != 0:
        raise ToolError(f"the predictor at {tool} does not answer: {done.stderr.strip().splitlines()[-1:]}")
    result: ProbeResult = json.loads(done.stdout.strip().splitlines()[-1])  # JSON edge: shaped by _PROBE
    return result


def _quiet_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore",
               AICONFIGURATOR_LOG_LEVEL="WARNING")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def gemm_mode(precision: Precision) -> str:
    """AIConfigurator's GEMM quant mode for a precision (the catalog's column; requests_for asks only for those
    that have one)."""
    mode = precision.row.gemm_mode
    if mode is None:
        raise ValueError(f"precision {precision.value} has no predictor GEMM mode: enginefoundry/catalog/precisions.py")
    return mode


def system_of(target: Target) -> str | None:
    for sku in (s.lower() for s in target.sku):
        for row in gpu_catalog.SKUS:  # the catalog's SKU rows, most specific first
            if row.predictor_system and row.needle in sku:
                return row.predictor_system
    return None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.\-a-z]+", v.lower()) if p)


def choose_db_version(pinned: str | None, versions: list[str], current: str | None = None) -> tuple[str, str]:
    """The database version for a toolchain: the pinned release if the database has it, else the package's own
    default (its `current` slot, aiconfigurator_core/systems/query_versions.yaml; the newest when it has none), with
    the disagreement stated."""
    if pinned and pinned in versions:
        return pinned, ""
    chosen = current if current in versions else max(versions, key=_version_tuple)
    if not pinned:
        return chosen, f"no TensorRT-LLM version pinned (toolchain.trtllm_version): predicted with database {chosen}"
    return chosen, (f"toolchain pins TensorRT-LLM {pinned}; the predictor's database has {', '.join(versions)}: "
                    f"predicted with {chosen}")


class AIConfigurator:
    """The predictor on AIConfigurator's `cli exp` (aggregated serving, and disaggregated with `search.disaggregated`),
    offline, cached under ~/.cache."""

    name = "aiconfigurator"

    def __init__(self, tool: Path | None = None, cache_dir: Path | None = None) -> None:
        self.tool = tool or find_tool()
        from enginefoundry.settings import cache_root

        self.cache_dir = cache_dir or cache_root() / "predictions"

    @property
    def version(self) -> str:
        return probe(self.tool)["version"] if self.tool else ""

    def coverage(self, spec: BuildSpec, target: Target, model_config: HfModelConfig | None) -> Coverage:
        if target.arch.value == "cpu":
            return Coverage(False, "cpu target: the predictor has perf databases for GPUs only")
        if self.tool is None:
            return Coverage(False, "predictor not installed: `make predict-venv` (or set EF_PREDICTOR)")
        system = system_of(target)
        if system is None:
            known = sorted({s.needle for s in gpu_catalog.SKUS if s.predictor_system})
            return Coverage(False, f"SKU {target.sku or '(none)'} has no predictor system: set targets[].sku to one "
                                   f"of {', '.join(known)}")
        backend = BACKEND_OF_LANE.get(spec.lane)
        probed = probe(self.tool)
        dbs = probed["databases"].get(system, {})
        if backend is None or backend not in dbs:
            return Coverage(False, f"no {backend or spec.lane} database for {system} in {self.name} {self.version}")
        if model_config is None:
            return Coverage(False, "no config.json without a download (a local source, model-configs/"
                                   "<model.name>.json beside the spec or in the package, or a Hub source)")
        arch = (model_config.get("architectures") or ["?"])[0]
        version, note = choose_db_version(spec.toolchain.trtllm_version, dbs[backend],
                                          probed.get("current", {}).get(system, {}).get(backend))
        if spec.lane == "reference":
            note = "; ".join(filter(None, [note, "lane reference serves with transformers: the prediction is "
                                                 "TensorRT-LLM's, so expect a large prediction_error"]))
        return Coverage(True, system=system, backend=backend, db_version=version,
                        note=f"{arch}; {note}" if note else arch)

    def predict(self, model_config: HfModelConfig, requests: list[Request],
                progress: Callable[[str], None] = print) -> list[Prediction]:
        if self.tool is None:
            raise ToolError("predictor not installed: run `make predict-venv` (or set EF_PREDICTOR)")
        version = self.version
        results: dict[str, Prediction] = {}
        misses = []
        for r in requests:
            hit = self._cached(r.key(version))
            if hit is not None:
                results[hit.key] = hit
            else:
                misses.append(r)
        if misses:
            progress(f"predict: {len(misses)} configuration search(es) with {self.name} {version} "
                     f"({len(requests) - len(misses)} cached)")
            for p in self._run(model_config, misses, version):
                self._store(p)
                results[p.key] = p
        return [results[r.key(version)] for r in requests]

    def _cached(self, key: str) -> Prediction | None:
        path = self.cache_dir / f"{key}.json"
        try:
            # Local state: only a regular file of a prediction's size (a FIFO or a device would hang the read).
            if path.is_symlink() or not path.is_file() or path.stat().st_size > CACHE_MAX_BYTES:
                return None
            p = Prediction.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return None  # absent or unreadable: predicted again, the bad file replaced
        return p.model_copy(update={"cached": True, "seconds": 0.0}) if p.key == key else None

    def _store(self, p: Prediction) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(p.model_dump_json())
        os.replace(tmp, self.cache_dir / f"{p.key}.json")

    def _run(self, model_config: HfModelConfig, requests: list[Request], version: str) -> list[Prediction]:
        with tempfile.TemporaryDirectory(prefix="ef-predict-") as tmp:
            model_dir = Path(tmp) / "model"
            model_dir.mkdir()
            (model_dir / "config.json").write_text(json.dumps(model_config))
            names = {f"e{i}_{r.precision.value}{'_disagg' if r.disagg else ''}": r for i, r in enumerate(requests)}
            (Path(tmp) / "exp.yaml").write_text(yaml.safe_dump(
                {name: disagg_experiment(r, model_dir) if r.disagg else experiment(r, model_dir)
                 for name, r in names.items()}, sort_keys=False))
            # Through the runner, like every tool: its own process group, killed with this process however it
            # dies (kill -9 included), a clean ToolError on timeout.
            done = run_tool([str(self.tool), "cli", "exp", "--yaml-path", str(Path(tmp) / "exp.yaml"),
                             "--save-dir", str(Path(tmp) / "out"), "--top-n", "16"], Path(tmp) / "cli-exp.log",
                            timeout_s=1800, env=_quiet_env(), cwd=Path(tmp), what=self.name, check=False)
            seconds = round(done.wall_s, 2)
            log = Path(done.log_path).read_text(errors="replace")
            return [read_experiment(Path(tmp) / "out", name, r, r.key(version), seconds, done.returncode, log)
                    for name, r in names.items()]


def experiment(r: Request, model_dir: Path) -> Experiment:
    """One `cli exp` experiment (aggregated serving) for a request. An end-to-end SLO is passed as `request_latency`
    (ms): the flat V2 task field of AIConfigurator 0.12.0 (aiconfigurator/sdk/task_v2.py `request_latency: float |
    None`; aiconfigurator/cli/exps/qwen3_32b_request_latency.yaml uses it in an `agg` experiment)."""
    tps = [t for t in (1, 2, 4, 8) if t <= r.max_gpus_per_replica] or [1]
    exp: Experiment = {"serving_mode": "agg", "model_path": str(model_dir), "system_name": r.coverage.system,
            "backend_name": r.coverage.backend, "backend_version": r.coverage.db_version,
            "isl": r.isl, "osl": r.osl, "ttft": float(r.ttft_ms), "tpot": float(r.tpot_ms),
            "total_gpus": r.total_gpus, "gemm_quant_mode": gemm_mode(r.precision),
            "agg_tp_candidates": tps, "agg_pp_candidates": [1]}
    if r.e2e_ms is not None:
        exp["request_latency"] = float(r.e2e_ms)
    return exp


def disagg_experiment(r: Request, model_dir: Path) -> DisaggExperiment:
    """One disaggregated `cli exp` experiment: the same model, system, backend, database version and GEMM mode for
    both roles; the worker counts and each role's parallelism are the tool's own search space (its defaults, as in
    aiconfigurator/cli/exps/qwen3_32b_disagg.yaml), capped by `total_gpus`."""
    role = {"model_path": str(model_dir), "system_name": r.coverage.system, "backend_name": r.coverage.backend,
            "backend_version": r.coverage.db_version, "gemm_quant_mode": gemm_mode(r.precision)}
    exp: DisaggExperiment = {
        "serving_mode": "disagg", "isl": r.isl, "osl": r.osl, "ttft": float(r.ttft_ms), "tpot": float(r.tpot_ms),
        "total_gpus": min(r.total_gpus, r.max_gpus_per_replica),
        "prefill_model_path": role["model_path"], "prefill_system_name": role["system_name"],
        "prefill_backend_name": role["backend_name"], "prefill_backend_version": role["backend_version"],
        "prefill_gemm_quant_mode": role["gemm_quant_mode"],
        "decode_model_path": role["model_path"], "decode_system_name": role["system_name"],
        "decode_backend_name": role["backend_name"], "decode_backend_version": role["backend_version"],
        "decode_gemm_quant_mode": role["gemm_quant_mode"]}
    if r.e2e_ms is not None:
        exp["request_latency"] = float(r.e2e_ms)
    return exp


def read_experiment(out: Path, name: str, r: Request, key: str, seconds: float, rc: int, log: str) -> Prediction:
    found = sorted(out.glob(f"*/{name}/best_config_topn.csv"))
    if not found:
        # The tool's own words: "Error running experiment <name>: <why>" (aiconfigurator/cli/main.py, 0.12.0).
        marker = f"Error running experiment {name}: "
        said = [line.split(marker, 1)[1] for line in log.splitlines() if marker in line]
        tail = " | ".join(log.strip().splitlines()[-2:])[-300:]
        why = (said[0][:400] if said else
               f"no configuration meets TTFT ≤ {r.ttft_ms:g} ms and TPOT ≤ {r.tpot_ms:g} ms" if rc == 0 else
               f"the predictor failed (exit {rc}): {tail}")
        return Prediction(key=key, precision=r.precision, ranked=[], pareto=[], problem=why, seconds=seconds,
                          disagg=r.disagg)
    ranked = [(_disagg_row if r.disagg else _row)(row, r.precision) for row in _rows(found[0])]
    ranked = [p for p in ranked if p.gpus <= r.max_gpus_per_replica and within_slo(p, r)]
    pareto = [(float(row["tokens/s/user"]), float(row["tokens/s/gpu"])) for row in _rows(found[0].parent /
                                                                                         "pareto.csv")]
    return Prediction(key=key, precision=r.precision, ranked=ranked, pareto=sorted(pareto), seconds=seconds,
                      problem="" if ranked else "no configuration fits the target's gpu_count", disagg=r.disagg)


def within_slo(p: Predicted, r: Request) -> bool:
    """With `request_latency` set, AIConfigurator 0.12.0 replaces the given TPOT by its own (TTFT, TPOT) pairs that
    sum to the request latency (aiconfigurator/sdk/pareto_analysis.py: `enumerate_ttft_tpot_constraints(osl,
    request_latency, ttft)`, aiconfigurator_core/sdk/utils.py), so the ITL and TTFT SLOs are applied again here."""
    return r.e2e_ms is None or (p.ttft_ms <= r.ttft_ms and p.tpot_ms <= r.tpot_ms)


def _rows(path: Path) -> Iterable[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _parallel(row: dict[str, str], column: str) -> int:
    """A parallel size column of the result (dp, moe_tp, moe_ep: ColumnsAgg in aiconfigurator_core/sdk/common.py,
    0.12.0); 1 where the row has none (a dense model's rows, an older output)."""
    value = (row.get(column) or "").strip()
    try:
        return max(int(float(value)), 1) if value else 1
    except ValueError:
        return 1


def _row(row: dict[str, str], precision: Precision) -> Predicted:
    power = float(row.get("power_w") or 0) or None
    return Predicted(precision=precision, tp=int(row["tp"]), pp=int(row["pp"]), batch_size=int(row["bs"]),
                     dp=_parallel(row, "dp"), moe_tp=_parallel(row, "moe_tp"), moe_ep=_parallel(row, "moe_ep"),
                     concurrency=int(float(row["concurrency"])), tokens_per_s_gpu=float(row["tokens/s/gpu"]),
                     tokens_per_s_user=float(row["tokens/s/user"]), ttft_ms=float(row["ttft"]),
                     tpot_ms=float(row["tpot"]), power_w=power)


def _worker(row: dict[str, str], role: str) -> Worker:
    """One role's columns of a disaggregated row: (p)workers, (p)tp, (p)pp, (p)dp, (p)moe_tp, (p)moe_ep, (p)bs
    (ColumnsDisagg, aiconfigurator_core/sdk/common.py, 0.12.0)."""
    def col(name: str) -> int:
        return _parallel(row, f"({role}){name}")
    return Worker(workers=col("workers"), tp=col("tp"), pp=col("pp"), dp=col("dp"), moe_tp=col("moe_tp"),
                  moe_ep=col("moe_ep"), batch_size=col("bs"))


def _disagg_row(row: dict[str, str], precision: Precision) -> Predicted:
    prefill, decode = _worker(row, "p"), _worker(row, "d")
    total = _parallel(row, "num_total_gpus") if row.get("num_total_gpus") else prefill.gpus + decode.gpus
    power = float(row.get("power_w") or 0) or None
    return Predicted(precision=precision, tp=decode.tp, pp=decode.pp, batch_size=decode.batch_size, dp=decode.dp,
                     moe_tp=decode.moe_tp, moe_ep=decode.moe_ep, concurrency=int(float(row["concurrency"])),
                     tokens_per_s_gpu=float(row["tokens/s/gpu"]), tokens_per_s_user=float(row["tokens/s/user"]),
                     ttft_ms=float(row["ttft"]), tpot_ms=float(row["tpot"]), power_w=power,
                     disagg=Disagg(prefill=prefill, decode=decode, total_gpus=total))


def config_digest(model_config: HfModelConfig) -> str:
    return hashlib.sha256(json.dumps(model_config, sort_keys=True).encode()).hexdigest()


def requests_for(search: SearchSpec, target: Target, coverage: Coverage, digest: str) -> list[Request]:
    """The aggregated request per precision, and with `search.disaggregated` a disaggregated one beside it."""
    per_replica = max(target.gpu_count, 1)
    modes = (False, True) if search.disaggregated else (False,)
    return [Request(target=target.name, precision=p, coverage=coverage, config_digest=digest,
                    isl=search.workload.mean_isl, osl=search.workload.osl, ttft_ms=search.slo.ttft_p95_ms,
                    tpot_ms=search.slo.itl_p95_ms, total_gpus=search.gpu_budget or per_replica,
                    max_gpus_per_replica=per_replica, e2e_ms=search.slo.e2e_p95_ms, disagg=d)
            for p in search.precisions if p.row.gemm_mode for d in modes]
