"""The reference lane: Hugging Face transformers + PyTorch, served by `transformers serve`.

It is how the whole DAG runs on a laptop, in CI and on GPUs without TensorRT-LLM, and it is the
accuracy reference for the TensorRT-LLM lanes. Its smoke stage judges the scoring server
(enginefoundry/smoke/serve.py: the same model code, with log-probs) unless `lane_options.smoke_server` is
`transformers`; the benchmark and the published serve.sh run `transformers serve`.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import JsonValue

from enginefoundry.confine import check_name
from enginefoundry.errors import InputError, PreflightError, ToolError
from enginefoundry.gpu.devices import host_facts, torch_device_facts
from enginefoundry.gpu.precisions import TORCH_DTYPE, activation_dtype
from enginefoundry.inputs.quantized_source import (
    DEQUANTIZED,
    SourceQuantization,
    read_quantization,
    spec_quantization,
    write_dequantized,
)
from enginefoundry.inputs.toolchain import ToolSurface
from enginefoundry.inputs.units import Unit
from enginefoundry.lanes.base import (
    BUNDLE_INFO,
    BuildResult,
    BundleInfo,
    Command,
    ConvertResult,
    Lane,
    ServeCommand,
    ServeSettings,
)
from enginefoundry.lanes.lora import BUNDLE_ADAPTERS_DIR, bundle_adapters, bundled_adapters  # adapters/<name>
from enginefoundry.lanes.moe_parallel import unsupported_problems
from enginefoundry.lanes.reference_options import reference_options
from enginefoundry.schemas.bundle_info import DeviceFacts
from enginefoundry.spec import Arch, BuildSpec, Variant
from enginefoundry.spec.lane_options import LaneOptions
from enginefoundry.store.backends import clone_or_copy, link_or_copy

TORCH_DTYPES = TORCH_DTYPE  # the one precision → dtype map
BUNDLE_MODEL_DIR = "model"
BUNDLE_DRAFT_DIR = "draft"  # speculative.draft (draft_target), bundled beside the model
# One thread per server: on small hosts torch's default thread count fights the benchmark client. No hub access:
# the bundle holds the model.
SERVE_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SCORING_SERVER = "enginefoundry scoring server"  # enginefoundry/smoke/serve.py: returns log-probs, does not stream


def _device_for(arch: Arch) -> str:
    return "cpu" if arch is Arch.CPU else "cuda:0"


@dataclass(frozen=True)
class _ScoringServer:
    """The scoring server of one bundle: its model, name and device, profile limits, draft and adapters."""

    model_dir: str
    name: str
    device: str
    max_seq_len: int | None
    max_batch: int | None
    draft_dir: str | None = None
    max_draft_len: int | None = None
    adapters: dict[str, str] | None = None

    def args(self, host: str, port: str) -> list[str]:
        """The scoring server's arguments after the interpreter, for the smoke stage and for `plan`; with a draft,
        the server answers by assisted generation (speculative.algorithm draft_target); with adapters
        (adapter_mode serve), each request's `model` picks the base or one adapter (PEFT)."""
        # `--name=`: a model name that starts with `-` stays a value.
        args = ["-m", "enginefoundry.smoke.serve", self.model_dir, "--host", host, "--port", port,
                f"--name={self.name}", "--device", self.device]
        for flag, value in (("--max-seq-len", self.max_seq_len), ("--max-batch", self.max_batch)):
            if value is not None:
                args += [flag, str(value)]
        if self.draft_dir is not None:
            args += ["--draft", self.draft_dir, "--max-draft-len", str(self.max_draft_len or 3)]
        for name, folder in (self.adapters or {}).items():
            args += ["--adapter", f"{name}={folder}"]
        return args


def _bundle_draft(bundle_dir: Path, info: BundleInfo) -> tuple[str, int] | None:
    """(the draft's folder, max_draft_len) of a speculative bundle, from its bundle.json; None for any other."""
    name, length = info.params.get("draft"), info.params.get("max_draft_len")  # JSON edge: the recorded params
    if name is None:
        return None
    if name != BUNDLE_DRAFT_DIR or not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise InputError(f"{bundle_dir / BUNDLE_INFO}: params.draft / max_draft_len are not a draft this lane "
                         "bundled; rebuild it")
    return str((bundle_dir / BUNDLE_DRAFT_DIR).resolve()), length


def _device(bundle_dir: Path, info: BundleInfo) -> str:
    """The device kind the bundle was built and warmed up on (`cpu`, `cuda`), from its bundle.json."""
    device = info.params.get("device")  # JSON edge: the build's params, as recorded
    if not isinstance(device, str):
        raise InputError(f"{bundle_dir / BUNDLE_INFO} records no params.device: not a bundle of lane "
                         f"{ReferenceLane.name}; rebuild it")
    return device.split(":")[0]


class ReferenceLane(Lane):
    name = "reference"
    sizes_kv_pool = False  # transformers allocates the KV cache per request: no pool to size
    # transformers' assisted generation (generate(..., assistant_model=draft)) on the scoring server
    speculative_algorithms = frozenset({"draft_target"})
    # model.adapters (merge: PEFT merges any rank; serve: PEFT serves any rank on the scoring server); the spec's own
    # bound (ModelSpec.max_lora_rank) is the ceiling, its default the TensorRT-LLM lane's (LoraConfig.max_lora_rank 64).
    max_lora_rank = 1024
    # A pre-quantized FP8/NVFP4 source is served as its weights dequantized (transformers computes 16-bit inputs): its
    # reference is those weights alone, like with like.
    quantizes_activations = False

    def speculative_twin(self, spec: BuildSpec) -> dict[str, bool] | None:
        """The scoring server answers a request with `"speculative": false` by the target alone."""
        return {"speculative": False} if spec.speculative is not None else None

    def validate_options(self, spec: BuildSpec) -> list[tuple[str, str]]:
        problems = super().validate_options(spec)
        if spec.speculative is not None and not problems:
            from enginefoundry.inputs.model_config import lookup
            from enginefoundry.lanes.speculation import spec_problems

            found = lookup(spec)
            problems += spec_problems(spec, None, found.config, found.source or "the model's config.json")
        quant = spec_quantization(spec)  # a pre-quantized source whose files are here (no download)
        for i, v in enumerate(spec.variants):
            if v.precision not in TORCH_DTYPES and not (quant is not None and quant.precision is v.precision
                                                        and quant.dequantizable):
                problems.append((f"variants.{i}.precision",
                                 f"{v.precision.value} is not available on the reference lane; "
                                 f"use one of {', '.join(p.value for p in TORCH_DTYPES)} or lane trtllm (a "
                                 "pre-quantized source of a format it dequantizes, "
                                 f"{', '.join(sorted(DEQUANTIZED))}, is served dequantized)"))
            if v.tp != 1 or v.pp != 1:
                problems.append((f"variants.{i}.tp", "the reference lane serves on one device: use tp: 1, pp: 1"))
        problems += unsupported_problems(spec, self.name, "serves on one device, every expert in one model: it has "
                                                          "no expert, MoE tensor or attention data parallelism")
        return problems

    def versions(self) -> dict[str, str]:
        """From the installed distributions' metadata, without importing torch (seconds): a run whose units
        are all published decides that before any model tooling loads. The metadata version is the one
        `torch.__version__` and `transformers.__version__` report (both are generated from it at build)."""
        try:
            return {"torch": version("torch").split("+")[0], "transformers": version("transformers")}
        except PackageNotFoundError as err:
            raise ToolError(
                f"the reference lane needs torch and transformers ({err.name} is missing): "
                "pip install -e '.[reference]'"
            ) from None

    def convert(self, spec: BuildSpec, variant: Variant, source_dir: Path, workdir: Path) -> ConvertResult:
        """Cast to the variant's dtype, one tensor at a time (enginefoundry/inputs/checkpoint_cast.py): peak memory is
        one tensor, and shards and tokenizer files that need no cast are hard-linked, not copied. The
        tokenizer files stay byte-identical to the source (the smoke stage compares tokenizer digests)."""
        from enginefoundry.inputs.checkpoint_cast import cast_checkpoint

        out = workdir / "checkpoint"
        if out.exists():
            shutil.rmtree(out)
        quant = read_quantization(source_dir)
        if quant is not None:
            return self._dequantize(variant, source_dir, quant, out)
        dtype = TORCH_DTYPES[variant.precision]
        cast_checkpoint(source_dir, out, dtype)
        return ConvertResult(checkpoint_dir=str(out), params={"dtype": dtype, "format": "safetensors"})

    def _dequantize(self, variant: Variant, source_dir: Path, quant: SourceQuantization, out: Path) -> ConvertResult:
        """A pre-quantized source (never quantized again): its codes × scales written as plain weights in the dtype an
        engine of it computes in (the checkpoint's 16-bit dtype, fp16 for an fp32 one: gpu.precisions.activation_dtype),
        on any device. What it computes is the weights' quantization: an FP8 or NVFP4 engine also quantizes each
        linear's input, which transformers does not (quantizes_activations False). The gate's reference is the same
        checkpoint dequantized (smoke/simulated.py `dequantized_checkpoint`)."""
        from enginefoundry.inputs.model_shape import checkpoint_shape

        if quant.precision is not variant.precision or not quant.dequantizable:
            raise InputError(f"variants[{variant.name}].precision: the source is pre-quantized ({quant.label()}); the "
                             f"reference lane serves it as {quant.precision.value} where it dequantizes the format "
                             f"({', '.join(sorted(DEQUANTIZED))}): set the variant's precision to "
                             f"{quant.precision.value}, or use lane trtllm")
        dtype = activation_dtype(variant.precision, checkpoint_shape(source_dir)) or "bfloat16"
        done = write_dequantized(source_dir, quant, out, torch_dtype=dtype, copy_files=_copy_top_level,
                                 activations=self.quantizes_activations)
        inputs = "; inputs not quantized (transformers)" if quant.quantizes_activations else ""
        return ConvertResult(checkpoint_dir=str(out), params={
            "dtype": dtype, "format": "safetensors", "prequantized": quant.key_json(),
            "dequantized": (f"{quant.quant_algo}: {done.layers} layers ({done.awq_scaled} AWQ-scaled) as "
                            f"{dtype}{inputs}")})

    def build(self, spec: BuildSpec, unit: Unit, checkpoint_dir: Path, workdir: Path,
              draft_dir: Path | None = None, adapter_dirs: dict[str, Path] | None = None) -> BuildResult:
        """Bundle the checkpoint and warm it up on the target's device, recording what that device is. With
        `adapter_dirs` (adapter_mode serve: name → fetched PEFT folder), the adapters are bundled beside the model
        and the bundle ships the scoring server, which serves the base and each adapter per request."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = _device_for(unit.target.arch)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise PreflightError(
                f"target {unit.target.name} ({unit.target.arch.value}) needs a CUDA GPU and torch sees none; "
                "run this unit on a worker of that target's pool"
            )
        bundle = workdir / "bundle"
        if bundle.exists():
            shutil.rmtree(bundle)
        # Hard links, not copies: the bundle's weights are its checkpoint's bytes (one inode, one blob).
        shutil.copytree(checkpoint_dir, bundle / BUNDLE_MODEL_DIR, copy_function=link_or_copy)
        speculative: dict[str, JsonValue] = {}  # the bundle's speculative params
        if spec.speculative is not None:
            if draft_dir is None or not Path(draft_dir).is_dir():
                raise InputError("speculative.draft: the reference lane's draft_target needs the fetched draft and "
                                 "none was given to the build: run the unit through the pipeline, which fetches it")
            # Copies (clones where the filesystem can), never hard links: the fetched draft of a local source is the
            # user's own folder (issue 21).
            shutil.copytree(draft_dir, bundle / BUNDLE_DRAFT_DIR, copy_function=clone_or_copy)
            speculative = {"speculative": spec.speculative.algorithm.value, "draft": BUNDLE_DRAFT_DIR,
                           "max_draft_len": spec.speculative.max_draft_len}
        names = bundle_adapters(bundle, adapter_dirs)  # copies, never hard links, as the draft's
        served: dict[str, JsonValue] = {"adapters": list[JsonValue](names)} if names else {}
        facts: DeviceFacts = {**host_facts(), **torch_device_facts(device)}
        t0 = time.monotonic()
        # The ignore: transformers types PreTrainedModel.to through a decorator whose stub takes the model twice.
        model = AutoModelForCausalLM.from_pretrained(bundle / BUNDLE_MODEL_DIR).to(device)  # type: ignore[arg-type]
        tok = AutoTokenizer.from_pretrained(bundle / BUNDLE_MODEL_DIR)
        ids = tok("warm-up", return_tensors="pt").to(device)
        with torch.no_grad():
            model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        warmup_s = time.monotonic() - t0
        params: dict[str, JsonValue] = {
            "device": device,
            "dtype": TORCH_DTYPES.get(unit.variant.precision) or str(model.dtype).removeprefix("torch."),
            "max_batch_size": unit.profile.max_batch_size,
            "max_seq_len": unit.profile.max_seq_len,
            **speculative,
            **served,
        }
        BundleInfo(lane=self.name, unit=unit.name, params=params, device=facts,
                   serve=ServeSettings(model_dir=BUNDLE_MODEL_DIR)).write(bundle)
        return BuildResult(bundle_dir=str(bundle), params=params, device=dict(facts),
                           metrics={"warmup_s": round(warmup_s, 3)})

    def serve_command(self, bundle_dir: Path, host: str, port: int) -> ServeCommand:
        info = BundleInfo.read(bundle_dir)
        # transformers serve has no assisted generation, and no per-request adapter (5.24 cli/serving: no PEFT)
        if _bundle_draft(bundle_dir, info) is not None or bundled_adapters(bundle_dir, info) is not None:
            return self._scoring_command(bundle_dir, info, host, port, str((bundle_dir / BUNDLE_MODEL_DIR).resolve()))
        model_dir = str((bundle_dir / BUNDLE_MODEL_DIR).resolve())
        serve = Path(sys.executable).with_name("transformers")
        argv = [str(serve) if serve.exists() else "transformers", "serve", model_dir,
                "--host", host, "--port", str(port), "--device", _device(bundle_dir, BundleInfo.read(bundle_dir))]
        # transformers serve pins the request `model` to the path it was started with.
        return ServeCommand(command=Command(argv=argv, env=dict(SERVE_ENV), description="transformers serve"),
                            model_name=model_dir, tokenizer_dir=model_dir)

    def smoke_logprobs_missing(self, spec: BuildSpec) -> str | None:
        """The scoring server returns both; `smoke_server: transformers` judges transformers serve, which returns
        neither (5.24: `logprobs`, `top_logprobs`, `echo` in its UNUSED_*_FIELDS; docs/smoke-gate.md)."""
        if reference_options(spec.lane_options).smoke_server == "transformers":
            return ("log-prob distance and teacher-forced log-probs: transformers serve returns no log-probs "
                    "(lane_options.smoke_server: transformers; the default, scoring, returns both)")
        return None

    def smoke_serve_command(self, bundle_dir: Path, host: str, port: int, name: str,
                            options: LaneOptions | None = None) -> ServeCommand:
        """The scoring server (enginefoundry/smoke/serve.py) on the bundle's model, device, max_seq_len and
        max_batch_size (the unit's profile, as an engine's limits): the
        same transformers model code and greedy decoding as `transformers serve`, plus the log-probs both of the
        gate's log-prob checks need (transformers serve 5.24 ignores `logprobs` and `echo`: docs/smoke-gate.md).
        `smoke_server: transformers` judges `transformers serve` itself."""
        info = BundleInfo.read(bundle_dir)
        if reference_options(options).smoke_server == "transformers" and _bundle_draft(bundle_dir, info) is None \
                and bundled_adapters(bundle_dir, info) is None:
            return self.named_serve_command(bundle_dir, host, port, name)
        return self._scoring_command(bundle_dir, info, host, port, name)

    def _scoring_command(self, bundle_dir: Path, info: BundleInfo, host: str, port: int, name: str) -> ServeCommand:
        """The scoring server on the bundle's model, device and profile limits; a speculative bundle's with its
        draft, and then it is the server the unit ships with (the benchmark measures it, serve.sh runs it)."""
        model_dir = str((bundle_dir / BUNDLE_MODEL_DIR).resolve())
        seq, batch = (v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None  # the recorded profile
                      for v in (info.params.get("max_seq_len"), info.params.get("max_batch_size")))
        draft = _bundle_draft(bundle_dir, info)
        adapters = bundled_adapters(bundle_dir, info)
        draft_dir, draft_len = draft or (None, None)
        server = _ScoringServer(model_dir, name, _device(bundle_dir, info), seq, batch, draft_dir, draft_len, adapters)
        argv = [sys.executable, *server.args(host, str(port))]
        what = SCORING_SERVER + (" (draft/target speculation)" if draft else "") + \
            (f" (base + {len(adapters)} LoRA adapters, PEFT, per request)" if adapters else "")
        return ServeCommand(command=Command(argv=argv, env=dict(SERVE_ENV), description=what),
                            model_name=name, tokenizer_dir=model_dir, shipped=draft is not None or adapters is not None)

    def named_serve_command(self, bundle_dir: Path, host: str, port: int, name: str) -> ServeCommand:
        """Serve as `transformers serve <name>` from a folder where `<name>` links to the bundle's model: the
        server pins requests to the id it was started with, and loads an id that exists as a local path from
        that path (transformers 5.24 cli/serving/model_manager.py `process_model_name`: `os.path.exists`).
        A name that is not a plain file name (no `/`, no `:`, no leading `-` or `.`) keeps the path."""
        info = BundleInfo.read(bundle_dir)
        if _bundle_draft(bundle_dir, info) is not None or bundled_adapters(bundle_dir, info) is not None:
            return self._scoring_command(bundle_dir, info, host, port, name)
        cmd = self.serve_command(bundle_dir, host, port)
        try:
            check_name(name, "model.name")
        except ValueError:
            return cmd
        argv = [name if a == cmd.model_name else a for a in cmd.command.argv]
        return cmd.model_copy(update={"command": cmd.command.model_copy(update={"argv": argv}),
                                      "model_name": name, "links": {name: cmd.model_name}})

    def describe(self, spec: BuildSpec, unit: Unit, surface: ToolSurface | None = None) -> list[Command]:
        dtype = TORCH_DTYPES.get(unit.variant.precision, unit.variant.precision.value)
        device = _device_for(unit.target.arch).split(":")[0]
        at = ["--host", "127.0.0.1", "--port", "<free>"]
        quant = spec_quantization(spec)
        convert = (Command(argv=["(in-process)", "dequantize", quant.quant_algo, "(the pre-quantized source, never "
                                 "quantized again; its 16-bit dtype, fp16 for fp32)"], description="convert")
                   if quant is not None else
                   Command(argv=["(in-process)", "cast_checkpoint", f"dtype={dtype}",
                                 "(streamed, one tensor at a time)"], description="convert"))
        commands = [
            convert,
            Command(argv=["(in-process)", "bundle + warm-up", f"device={_device_for(unit.target.arch)}"],
                    description="build"),
        ]
        if spec.model.serves_adapters:
            served = {a.name: f"<bundle>/{BUNDLE_ADAPTERS_DIR}/{a.name}" for a in spec.model.adapters}
            commands.append(Command(
                argv=["python", *_ScoringServer("<bundle>/model", spec.model.name, device, unit.profile.max_seq_len,
                                                unit.profile.max_batch_size,
                                                adapters=served).args("127.0.0.1", "<free>")],
                env=dict(SERVE_ENV),
                description="serve, smoke and benchmark: the base and every LoRA adapter (PEFT), chosen per request "
                            "by the OpenAI `model` name (transformers serve has no per-request adapter); the smoke "
                            "gate asks each adapter by its name and judges it against its own merged reference"))
            return commands
        sp = spec.speculative
        if sp is not None:
            commands.append(Command(
                argv=["python", *_ScoringServer("<bundle>/model", spec.model.name, device, unit.profile.max_seq_len,
                                                unit.profile.max_batch_size, f"<bundle>/{BUNDLE_DRAFT_DIR}",
                                                sp.max_draft_len).args("127.0.0.1", "<free>")],
                env=dict(SERVE_ENV),
                description="serve, smoke and benchmark: draft/target speculation by transformers' assisted "
                            "generation (the smoke gate also asks each prompt with speculative: false, its twin)"))
            return commands
        if reference_options(spec.lane_options).smoke_server == "scoring":
            commands.append(Command(
                argv=["python", *_ScoringServer("<bundle>/model", spec.model.name, device, unit.profile.max_seq_len,
                                                unit.profile.max_batch_size).args("127.0.0.1", "<free>")],
                env=dict(SERVE_ENV),
                description="smoke serve (returns log-probs; the benchmark and serve.sh run transformers serve)"))
        commands.append(Command(argv=["transformers", "serve", spec.model.name, *at, "--device", device],
                                env=dict(SERVE_ENV),
                                description=f"serve (from a folder where {spec.model.name} links to <bundle>/model)"))
        return commands


def _copy_top_level(folder: Path, out: Path, names: set[str]) -> int:
    """The files of `folder` (not its subfolders) named in `names`, copied byte for byte into `out` (the tokenizer
    files stay the source's: the smoke stage compares their digests); how many."""
    copied = [f for f in folder.iterdir() if f.is_file() and f.name in names]
    for f in copied:
        shutil.copyfile(f, out / f.name)
    return len(copied)
