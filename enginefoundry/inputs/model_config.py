"""A checkpoint's `config.json` before anything is downloaded, for `plan`'s memory estimates and the predictor.

Looked for, in order: the local source's own config.json; `model-configs/<model.name>.json` beside the spec (a
user's own configs); the package's `configs/model-configs/<model.name>.json`; and, for a Hub source, `config.json`
at the spec's pinned revision: from the Hugging Face cache, or, when the caller allows one download (`search`),
fetched alone with `huggingface_hub.hf_hub_download` (into that cache, so the next lookup reads it offline). Nothing
else of the repository is fetched. Every file is read bounded, as a regular file holding a JSON object.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from enginefoundry.confine import UnsafePathError, check_name
from enginefoundry.schemas.base import DocumentError, parse_json
from enginefoundry.schemas.loose import HfModelConfig
from enginefoundry.spec import BuildSpec, SourceKind

# The configs shipped with the package (two Llama configs), so estimates work before anything is downloaded.
KNOWN_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "model-configs"
BESIDE_SPEC = "model-configs"  # the user's own folder of configs, beside the spec
MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few KiB; DeepSeek-V3's is under 2 KiB
CONFIG = "config.json"



class ConfigLookup(BaseModel):
    """The config found (or None), where it came from, and why there is none when there is none."""

    config: HfModelConfig | None = None
    source: str = ""
    why: str = ""


def read_config(path: Path) -> HfModelConfig | None:
    """A config.json: a regular file (not a FIFO or a device) of at most MAX_CONFIG_BYTES holding a JSON object;
    None otherwise (the caller says where else it looked)."""
    try:
        if path.is_symlink() and not path.resolve().is_file():
            return None
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        with path.open("rb") as f:
            data = parse_json(f.read(MAX_CONFIG_BYTES + 1), what=str(path), max_bytes=MAX_CONFIG_BYTES)
    except (OSError, DocumentError):
        return None
    return data if isinstance(data, dict) else None


def lookup(spec: BuildSpec, fetch: bool = False) -> ConfigLookup:
    """The spec's model config, from the first place that has it; `fetch`: a Hub source's config.json may be
    downloaded (that one file) when no cached copy exists."""
    src = spec.model.parsed_source(spec.base_path)
    looked: list[str] = []
    if src.kind is SourceKind.LOCAL:
        path = Path(src.location) / CONFIG
        found = read_config(path)
        if found is not None:
            return ConfigLookup(config=found, source=str(path))
        looked.append(str(path))
    try:
        name = check_name(f"{spec.model.name}.json", "model.name")
    except UnsafePathError:
        name = None
    if name:
        for folder in (spec.base_path / BESIDE_SPEC, KNOWN_CONFIGS):
            found = read_config(folder / name)
            if found is not None:
                return ConfigLookup(config=found, source=str(folder / name))
            looked.append(str(folder / name))
    if src.kind is SourceKind.HF:
        return hub_config(src.location, src.revision or "main", fetch, looked)
    return ConfigLookup(why="no config.json without a download (looked in " + ", ".join(looked) + ")")


def hub_config(repo: str, revision: str, fetch: bool, looked: list[str]) -> ConfigLookup:
    """config.json of `repo` at `revision`: from the Hugging Face cache, else (with `fetch`) that file alone."""
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache

    where = f"{repo}@{revision}"
    cached = try_to_load_from_cache(repo, CONFIG, revision=revision)
    if isinstance(cached, str):
        found = read_config(Path(cached))
        if found is not None:
            return ConfigLookup(config=found, source=f"{where} config.json (Hugging Face cache)")
    if not fetch:
        return ConfigLookup(why=f"config.json of {where} is not in the Hugging Face cache and `plan` downloads "
                                "nothing: run `enginefoundry search` (it fetches that one file), or put it in "
                                f"{BESIDE_SPEC}/<model.name>.json beside the spec")
    endpoint = constants.ENDPOINT
    try:
        path = hf_hub_download(repo, CONFIG, revision=revision)
    except Exception as err:  # every hub failure (network, 404, gated, offline) becomes the reason
        return ConfigLookup(why=f"config.json of {where} could not be fetched from {endpoint} ({type(err).__name__}): "
                                "check HF_ENDPOINT / HF_TOKEN, or put it in "
                                f"{BESIDE_SPEC}/<model.name>.json beside the spec (also looked in "
                                + ", ".join(looked) + ")")
    found = read_config(Path(path))
    if found is None:
        return ConfigLookup(why=f"config.json of {where} is not a JSON object of at most {MAX_CONFIG_BYTES} bytes")
    return ConfigLookup(config=found, source=f"{where} config.json (fetched from {endpoint})")


def model_config_for(spec: BuildSpec, fetch: bool = False) -> HfModelConfig | None:
    return lookup(spec, fetch).config


def expert_count(config: HfModelConfig | None) -> int:
    """Routed experts of a mixture-of-experts config (Qwen3-MoE `num_experts`, Mixtral `num_local_experts`,
    DeepSeek-V3 `n_routed_experts`); 0 for a dense model."""
    if not config:
        return 0
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return 0
