"""Model configuration: one frozen dataclass for the Llama family (Llama-3.x, Qwen2/2.5, Qwen3,
Mistral, SmolLM2), read from a Hugging Face `config.json` dictionary."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dustin_runtime.errors import DustinError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (Hugging Face `rope_parameters` / `rope_scaling`)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    attention_factor: float | None = None  # yarn
    truncate: bool = True  # yarn


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of one decoder; `n_rep = num_heads // num_kv_heads` query heads share a KV head."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    attention_bias: bool = False  # q/k/v biases (Qwen2); Llama's attention_bias also adds an o bias
    o_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    name: str = ""

    @property
    def n_rep(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (embedding and LM head counted once each unless tied)."""
        d, L = self.hidden_size, self.num_layers
        attn = d * (self.q_size + 2 * self.kv_size) + self.q_size * d
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.o_bias:
            attn += d
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * d * self.intermediate_size
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return L * (attn + mlp + 2 * d) + d + emb

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def with_name(self, name: str) -> ModelConfig:
        return replace(self, name=name)


def _rope_from_hf(d: dict) -> RopeConfig:
    params = dict(d.get("rope_parameters") or {})
    scaling = d.get("rope_scaling") or {}
    params = {**params, **{k: v for k, v in scaling.items() if v is not None}}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    rtype = params.get("rope_type", params.get("type", "default")) or "default"
    if rtype not in SUPPORTED_ROPE_TYPES:
        raise DustinError(
            f"unsupported rope scaling type {rtype!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    omax = params.get("original_max_position_embeddings")
    if rtype == "yarn" and omax is None:
        omax = d.get("max_position_embeddings")

    def opt(key: str) -> float | None:
        v = params.get(key)
        return None if v is None else float(v)

    return RopeConfig(
        theta=theta,
        type=rtype,
        factor=float(params.get("factor", 1.0) or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=None if omax is None else int(omax),
        beta_fast=float(params.get("beta_fast", 32.0) or 32.0),
        beta_slow=float(params.get("beta_slow", 1.0) or 1.0),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
        attention_factor=opt("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


def _finite_forward(rope: RopeConfig, rms_eps: float, source: str) -> None:
    """Refuse the fields that make the forward NaN or Inf (token 0 forever, exit 0 otherwise)."""
    import math

    for key, v in (("rope_theta", rope.theta), ("rope factor", rope.factor), ("rms_norm_eps", rms_eps)):
        if not (math.isfinite(v) and v > 0):
            raise DustinError(f"{source}: {key} must be a finite number > 0, got {v!r}")
    for key, v in (("low_freq_factor", rope.low_freq_factor), ("high_freq_factor", rope.high_freq_factor),
                   ("beta_fast", rope.beta_fast), ("beta_slow", rope.beta_slow)):
        if not (math.isfinite(v) and v > 0):
            raise DustinError(f"{source}: rope {key} must be a finite number > 0, got {v!r}")
    if rope.type == "llama3" and rope.high_freq_factor <= rope.low_freq_factor:
        raise DustinError(f"{source}: rope high_freq_factor {rope.high_freq_factor} must exceed low_freq_factor "
                          f"{rope.low_freq_factor} (llama3 scaling divides by their difference)")


def _positive_int(d: dict, key: str, where: str, default: int | None = None) -> int:
    v = d.get(key)
    if v is None:
        if default is None:
            raise DustinError(f"{where}: missing {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
        raise DustinError(f"{where}: {key} must be a positive integer, got {v!r}")
    return int(v)


def _ids(d: dict, key: str, where: str) -> tuple[int, ...]:
    v = d.get(key)
    vals = [] if v is None else v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise DustinError(f"{where}: {key} must be a token id or a list of them, got {v!r}")
    return tuple(vals)


def config_from_hf(d: dict, name: str = "", source: str = "config.json") -> ModelConfig:
    """Build a `ModelConfig` from a Hugging Face config dictionary; refuses what we cannot run, and
    a malformed dictionary, with one line naming `source` and the field."""
    if not isinstance(d, dict):
        raise DustinError(f"{source}: expected a JSON object, got {type(d).__name__}")
    arch = d.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise DustinError(
            f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)} "
            "(Llama-3.x, Mistral, Qwen2/Qwen2.5, Qwen3, SmolLM2)"
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise DustinError(f"unsupported activation {act!r}: only SwiGLU (silu) MLPs are supported")
    if d.get("mlp_bias"):
        raise DustinError("MLP biases are not supported")
    for key in ("rope_parameters", "rope_scaling"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise DustinError(f"{source}: {key} must be an object, got {d[key]!r}")
    hidden = _positive_int(d, "hidden_size", source)
    heads = _positive_int(d, "num_attention_heads", source)
    kv_heads = _positive_int(d, "num_key_value_heads", source, default=heads)
    head_dim = _positive_int(d, "head_dim", source, default=max(1, hidden // heads))
    if heads % kv_heads:
        raise DustinError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    attention_bias = bool(d.get("attention_bias", False))
    o_bias = attention_bias
    if arch == "qwen2":
        attention_bias, o_bias = True, False
    window = None
    if arch == "mistral" and d.get("sliding_window"):
        window = _positive_int(d, "sliding_window", source)
    if arch in ("qwen2", "qwen3") and d.get("use_sliding_window") and d.get("sliding_window"):
        window = _positive_int(d, "sliding_window", source)
    try:
        rope = _rope_from_hf(d)
        rms_eps = float(d.get("rms_norm_eps", 1e-6))
    except (TypeError, ValueError) as e:
        raise DustinError(f"{source}: malformed rope or norm field ({e})") from None
    _finite_forward(rope, rms_eps, source)
    bos = d.get("bos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=_positive_int(d, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=_positive_int(d, "intermediate_size", source),
        num_layers=_positive_int(d, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=_positive_int(d, "max_position_embeddings", source, default=4096),
        rms_eps=rms_eps,
        rope=rope,
        attention_bias=attention_bias,
        o_bias=o_bias,
        qk_norm=arch == "qwen3",
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        bos_token_id=(_ids(d, "bos_token_id", source) or (None,))[0] if bos is not None else None,
        eos_token_ids=_ids(d, "eos_token_id", source),
        sliding_window=window,
        name=name or str(d.get("_name_or_path", "") or ""),
    )
