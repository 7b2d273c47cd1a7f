"""Published model shapes, for random-weight speed work (timings do not depend on values) and for
shape tables in benchmarks. Values are those of the models' config.json files."""

from __future__ import annotations

from dustin_runtime.config import ModelConfig, RopeConfig
from dustin_runtime.errors import DustinError

_LLAMA3_ROPE = dict(theta=500000.0, type="llama3", factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8192)

PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig("qwen2", 151936, 896, 4864, 24, 14, 2, 64, 32768, 1e-6,
                                RopeConfig(theta=1000000.0), attention_bias=True, tie_word_embeddings=True,
                                eos_token_ids=(151643, 151645), name="Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-7b": ModelConfig("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1e-6,
                              RopeConfig(theta=1000000.0), attention_bias=True,
                              eos_token_ids=(151643, 151645), name="Qwen/Qwen2.5-7B-Instruct"),
    "qwen2.5-72b": ModelConfig("qwen2", 152064, 8192, 29568, 80, 64, 8, 128, 32768, 1e-6,
                               RopeConfig(theta=1000000.0), attention_bias=True,
                               eos_token_ids=(151643, 151645), name="Qwen/Qwen2.5-72B-Instruct"),
    "llama-3.2-1b": ModelConfig("llama", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 1e-5,
                                RopeConfig(**{**_LLAMA3_ROPE, "factor": 32.0}), tie_word_embeddings=True,
                                eos_token_ids=(128001, 128008, 128009), name="meta-llama/Llama-3.2-1B-Instruct"),
    "llama-3.1-8b": ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, 131072, 1e-5,
                                RopeConfig(**_LLAMA3_ROPE),
                                eos_token_ids=(128001, 128008, 128009), name="meta-llama/Llama-3.1-8B-Instruct"),
    "llama-3.1-70b": ModelConfig("llama", 128256, 8192, 28672, 80, 64, 8, 128, 131072, 1e-5,
                                 RopeConfig(**_LLAMA3_ROPE),
                                 eos_token_ids=(128001, 128008, 128009), name="meta-llama/Llama-3.1-70B-Instruct"),
    "smollm2-135m": ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 8192, 1e-5,
                                RopeConfig(theta=100000.0), tie_word_embeddings=True,
                                eos_token_ids=(2,), name="HuggingFaceTB/SmolLM2-135M-Instruct"),
}
ALIASES = {"llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b", "llama-3-1b": "llama-3.2-1b",
           "smollm2": "smollm2-135m"}
DEFAULT_DRAFT = {"qwen2.5-7b": "qwen2.5-0.5b", "qwen2.5-72b": "qwen2.5-0.5b", "llama-3.1-8b": "llama-3.2-1b",
                 "llama-3.1-70b": "llama-3.2-1b", "smollm2-135m": "smollm2-135m"}


def preset(name: str) -> ModelConfig:
    """The config of a named shape (e.g. 'qwen2.5-7b'); refuses unknown names with the list."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise DustinError(f"unknown model shape {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[key]


def default_draft(name: str) -> str:
    """The usual draft shape for a target shape."""
    key = ALIASES.get(name.lower(), name.lower())
    return DEFAULT_DRAFT.get(key, "qwen2.5-0.5b")
