"""Calibration windows from text, JSONL and parquet: exact lengths, fixed by the seed."""

import json

import pandas as pd
import pytest

from dustin_profile import calibration as cal
from dustin_runtime.errors import DustinError


class CharTokenizer:
    """One token per character (ids = code points), a BOS of 1: enough to test the cutting."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}

    def encode(self, text, add_special_tokens=True):
        return self(text, add_special_tokens)["input_ids"]


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "a.txt").write_text("".join(f"line {i} of a\n" for i in range(400)))
    (tmp_path / "b.md").write_text("".join(f"row {i} of b\n" for i in range(300)))
    (tmp_path / "short.txt").write_text("tiny\n")
    (tmp_path / "recs.jsonl").write_text("\n".join(json.dumps({"text": f"{i} " * 200, "id": i}) for i in range(3)))
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"body": ["xyz " * 150, "q"]}).to_parquet(tmp_path / "pq" / "t.parquet")
    return tmp_path


def test_windows_exact_length_and_seeded(corpus):
    docs = cal.read_documents([str(corpus / "*.*")])
    assert [d.name.rsplit("/", 1)[-1] for d in docs][:3] == ["a.txt", "b.md", "recs.jsonl:0"]
    tok = CharTokenizer()
    a = cal.cut_windows(tok, docs, 7, 300, seed=0)
    b = cal.cut_windows(tok, docs, 7, 300, seed=0)
    c = cal.cut_windows(tok, docs, 7, 300, seed=1)
    assert a == b and cal.windows_hash(a) == cal.windows_hash(b) != cal.windows_hash(c)
    assert all(len(w.tokens) == 300 and w.tokens[0] == 1 for w in a)
    assert not any("short" in w.source for w in a)
    for w in a:  # the window is the document's text from its offset
        text = next(d.text for d in docs if d.name == w.source)
        assert "".join(map(chr, w.tokens[1:])) == text[w.offset: w.offset + 299]


def test_jsonl_and_parquet_fields(corpus):
    assert len(cal.read_documents([str(corpus / "recs.jsonl")])) == 3
    docs = cal.read_documents([str(corpus / "pq" / "t.parquet")], text_field="body")
    assert docs[0].text.startswith("xyz") and docs[1].name.endswith("t.parquet:1")
    with pytest.raises(DustinError, match="'nope' string"):
        cal.read_documents([str(corpus / "recs.jsonl")], text_field="nope")
    with pytest.raises(DustinError, match="cannot read column 'text'"):
        cal.read_documents([str(corpus / "pq" / "t.parquet")])


def test_errors(corpus, tmp_path):
    with pytest.raises(DustinError, match="no such calibration file"):
        cal.read_documents([str(tmp_path / "missing")])
    docs = cal.read_documents([str(corpus / "short.txt")])
    with pytest.raises(DustinError, match="no calibration document has 300 tokens"):
        cal.cut_windows(CharTokenizer(), docs, 1, 300)
    with pytest.raises(DustinError, match="too short"):
        cal.verification_positions(20, 4, 8)


def test_positions_in_last_quarter():
    pos = cal.verification_positions(4096, 4, 8)
    assert pos == [4096 - 128 * j for j in range(8)]
    assert cal.verification_positions(100, 4, 8)[:3] == [100, 95, 90]


def test_retrieval_window_places_fact_question_and_answer(corpus):
    docs = cal.read_documents([str(corpus / "a.txt"), str(corpus / "b.md")])
    tok = CharTokenizer()
    ctx, extra = 700, 5
    w = cal.retrieval_window(tok, docs, ctx, extra, index=3, seed=0)
    assert w == cal.retrieval_window(tok, docs, ctx, extra, index=3, seed=0)  # deterministic
    assert w.tokens != cal.retrieval_window(tok, docs, ctx, extra, index=4, seed=0).tokens
    assert len(w.tokens) == ctx + extra and w.tokens[0] == 1 and w.source.startswith("retrieval:")
    text = "".join(map(chr, w.tokens[1:]))
    prompt, answer = text[: ctx - 1], text[ctx - 1:]
    name, code = prompt.split("The access code for the ")[1].split(" vault is ")
    code = code.split(".")[0]
    assert len(code) == 6 and code.isdigit()
    assert prompt.endswith(f"Answer: the access code for the {name} vault is")  # the pass at L = ctx answers it
    assert answer == f" {code}."[:extra]
    a, b = w.fact  # the fact's rows, as the profiler scores the question pass
    assert "".join(map(chr, w.tokens[a:b])) == f"\nThe access code for the {name} vault is {code}.\n"
    with pytest.raises(DustinError, match="too short"):
        cal.retrieval_window(tok, docs, 120, extra, index=0)
