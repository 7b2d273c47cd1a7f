"""Tokenizers through `AutoTokenizer` (folders and GGUF files), chat templates, and the check that a
draft and a target share a vocabulary (positions and token ids must align).

Building a tokenizer from a GGUF's metadata takes seconds (tens on a loaded 2-core machine), so it is
built once and kept, saved as one JSON file of the tokenizer's own files, in the cache folder
(`loader.cache_dir`, keyed by the GGUF's size, mtime and sampled-content fingerprint and the
transformers version); a cache file that is missing, torn or does not load is rebuilt."""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path

from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_write, read_json
from dustin_runtime.loader import Checkpoint, cache_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
CACHE_FORMAT = 1  # bump when the cached form changes


def load_tokenizer(ckpt: Checkpoint):
    """The Hugging Face tokenizer of a checkpoint; a folder without tokenizer files, or a tokenizer
    that does not load or holds no vocabulary, is refused with one line."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    ckpt = ckpt.tokenizer_checkpoint()
    if ckpt.kind == "hf" and not any((ckpt.path / f).is_file() for f in TOKENIZER_FILES):
        raise DustinError(f"{ckpt.model_id}: no tokenizer files in this folder (one of {', '.join(TOKENIZER_FILES)}); "
                          "copy the tokenizer of the model beside its config.json")
    cached = tokenizer_cache_file(ckpt) if ckpt.kind == "gguf" else None
    tok = _from_cache(cached) if cached is not None else None
    if tok is not None:
        return tok
    try:
        if ckpt.kind == "gguf":
            tok = AutoTokenizer.from_pretrained(str(ckpt.path.parent), gguf_file=ckpt.path.name)
        else:
            tok = AutoTokenizer.from_pretrained(str(ckpt.path))
        size = len(tok.get_vocab())
    except Exception as e:  # the many ways a damaged tokenizer fails inside transformers / tokenizers
        first = (str(e).strip().splitlines() or [""])[0]
        raise DustinError(f"{ckpt.model_id}: cannot load its tokenizer ({type(e).__name__}: {first})") from None
    if size == 0:
        raise DustinError(f"{ckpt.model_id}: its tokenizer has an empty vocabulary")
    if cached is not None:
        _to_cache(tok, cached)
    return tok


def tokenizer_cache_file(ckpt: Checkpoint) -> Path:
    """The cache file of a GGUF's tokenizer: its key changes when the file (size, mtime, sampled
    content) or the transformers that builds the tokenizer changes."""
    import transformers

    st = ckpt.path.stat()
    ident = f"{CACHE_FORMAT}:{transformers.__version__}:{st.st_size}:{st.st_mtime_ns}:{ckpt.weights_fingerprint()}"
    return cache_dir("tokenizers") / f"{ckpt.path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def _from_cache(path: Path):
    """The tokenizer kept at `path`, or None when there is none or it is damaged (then rebuilt)."""
    from transformers import AutoTokenizer

    try:
        data = read_json(path, "tokenizer cache")
    except DustinError:
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None
    if not isinstance(files, dict) or "tokenizer.json" not in files:
        return None
    with tempfile.TemporaryDirectory(prefix="dustin-tokenizer-") as folder:
        try:
            for name, text in files.items():
                if Path(name).name != name or not isinstance(text, str):
                    return None
                (Path(folder) / name).write_text(text, encoding="utf-8")
            tok = AutoTokenizer.from_pretrained(folder)
            return tok if len(tok.get_vocab()) > 0 else None
        except Exception:  # whatever a damaged tokenizer.json makes transformers / tokenizers raise
            return None


def _to_cache(tok, path: Path) -> None:
    """Keep `tok` at `path` (atomically); a cache folder that cannot be written is skipped."""
    with tempfile.TemporaryDirectory(prefix="dustin-tokenizer-") as folder:
        tok.save_pretrained(folder)
        files = {f.name: f.read_text(encoding="utf-8") for f in sorted(Path(folder).iterdir()) if f.is_file()}
    try:
        atomic_write(path, json.dumps({"format": CACHE_FORMAT, "files": files}))
    except DustinError:
        pass  # a read-only or full cache: build again next time


def vocab_hash(tokenizer) -> str:
    """A short hash of the token -> id map (special tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def check_same_vocab(target_tok, draft_tok, target_id: str, draft_id: str) -> None:
    """Refuse a draft whose tokenizer differs from the target's."""
    if vocab_hash(target_tok) != vocab_hash(draft_tok):
        raise DustinError(
            f"draft {draft_id} and target {target_id} have different vocabularies "
            f"({len(draft_tok)} vs {len(target_tok)} tokens): speculative decoding needs a shared tokenizer"
        )


def encode(tokenizer, text: str, *, chat: bool = False, system: str | None = None) -> list[int]:
    """Token ids of a prompt; with `chat`, wrapped in the tokenizer's chat template as one user turn
    with the generation prompt appended."""
    if not text or not text.strip():
        raise DustinError("empty prompt: give --prompt some text (or a --prompts file holding text)")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise DustinError("this tokenizer has no chat template; drop --chat")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer.encode(text, add_special_tokens=True)


def text_ids(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of `text` as it stands (`encode` for a prompt), for the harnesses' books and
    needles: no chat template, no emptiness check, no length warnings (long contexts are the point)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens, verbose=False)["input_ids"])


def eos_ids(tokenizer, config_eos: tuple[int, ...] = ()) -> tuple[int, ...]:
    """End-of-sequence ids: the model config's plus the tokenizer's (and <|im_end|>/<|eot_id|> where
    a chat template ends turns with them)."""
    ids = set(config_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for t in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
        if t in vocab:
            ids.add(int(vocab[t]))
    return tuple(sorted(ids))
