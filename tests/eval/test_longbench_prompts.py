"""LongBench prompt templates, middle truncation and chat formatting."""

import pytest

from dustin_eval.longbench_config import (
    DATASETS,
    NO_CHAT_DATASETS,
    max_new_tokens,
    prompt_templates,
)
from dustin_eval.longbench_data import (
    build_prompt,
    format_prompt,
    middle_truncate,
    stop_ids,
    uses_chat_template,
)
from dustin_runtime.errors import DustinError

SAMPLE = {  # the fields of a multi_news.jsonl line
    "input": "QUESTION_TEXT",
    "context": "CONTEXT_TEXT",
    "answers": ["an answer"],
    "length": 3,
    "dataset": "multi_news",
    "language": "en",
    "all_classes": None,
    "_id": "abc",
}
NO_INPUT = {"gov_report", "multi_news", "passage_count", "lcc"}


def test_tables_cover_the_16_english_subsets():
    assert len(DATASETS) == 16
    assert set(prompt_templates()) == set(DATASETS) == set(max_new_tokens())
    expected = {
        "narrativeqa": 128,
        "qasper": 128,
        "multifieldqa_en": 64,
        "hotpotqa": 32,
        "2wikimqa": 32,
        "musique": 32,
        "gov_report": 512,
        "qmsum": 512,
        "multi_news": 512,
        "trec": 64,
        "triviaqa": 32,
        "samsum": 128,
        "passage_count": 32,
        "passage_retrieval_en": 32,
        "lcc": 64,
        "repobench-p": 64,
    }
    assert dict(max_new_tokens()) == expected


@pytest.mark.parametrize("dataset", DATASETS)
def test_template_formats_with_multi_news_fields(dataset):
    text = format_prompt(SAMPLE, dataset)
    assert "CONTEXT_TEXT" in text
    assert ("QUESTION_TEXT" in text) == (dataset not in NO_INPUT)
    assert "{" not in text.replace("{context}", "")  # no field left unfilled


def test_published_template_text():
    t = prompt_templates()
    assert t["multi_news"] == (
        "You are given several news passages. Write a one-page summary of all news. \n\n"
        "News:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:"
    )
    assert t["lcc"] == "Please complete the code given below. \n{context}Next line of code:\n"
    assert t["trec"].endswith("{context}\n{input}")


def test_middle_truncate_keeps_exact_length_and_both_ends():
    ids = list(range(100))
    head, tail = middle_truncate(ids, 10)
    assert head + tail == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    head, tail = middle_truncate(ids, 11)  # odd: int(11 / 2) from each end, as the reference
    assert head == [0, 1, 2, 3, 4] and tail == [95, 96, 97, 98, 99]
    assert middle_truncate(ids, 100) == (ids, [])
    assert middle_truncate(ids, 1000) == (ids, [])


def test_build_prompt_truncates_in_the_middle_char_tokenizer(char_tokenizer):
    tok = char_tokenizer
    sample = dict(SAMPLE, context="H" * 300 + "M" * 1000 + "T" * 300, input="Q?")
    p = build_prompt(tok, sample, "trec", 200)  # trec: no chat template
    assert p.truncated and not p.chat
    assert len(p.ids) == 200  # the BOS counted in the head is decoded away and added back
    text = tok.decode(p.ids, skip_special_tokens=True)
    assert text.startswith("Please determine the type") and text.endswith("TTTT\nQ?")
    assert "M" not in text
    full = build_prompt(tok, sample, "trec", 10_000)
    assert not full.truncated and len(full.ids) == full.raw_tokens


def test_build_prompt_chat_char_tokenizer(char_tokenizer):
    tok = char_tokenizer
    p = build_prompt(tok, SAMPLE, "hotpotqa", 10_000)
    text = tok.decode(p.ids)
    assert (
        p.chat
        and text.startswith("<user>Answer the question")
        and text.endswith("</user><assistant>")
    )
    assert tok.bos_token_id not in p.ids  # the template owns the special tokens


def test_chat_template_applied_per_dataset(char_tokenizer):
    tok = char_tokenizer
    for dataset in DATASETS:
        text = tok.decode(build_prompt(tok, SAMPLE, dataset, 10_000).ids)
        assert text.startswith("<user>") == (dataset not in NO_CHAT_DATASETS), dataset
        assert uses_chat_template(dataset) == (dataset not in NO_CHAT_DATASETS)
    assert NO_CHAT_DATASETS == {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}


def test_prompt_limit_too_small(char_tokenizer):
    with pytest.raises(DustinError):
        build_prompt(char_tokenizer, SAMPLE, "trec", 1)


def test_stop_ids_samsum_adds_newline(char_tokenizer):
    tok = char_tokenizer
    assert stop_ids(tok, "samsum", [2]) == ([2, ord("\n") + 3], 1)
    assert stop_ids(tok, "qmsum", [2, 7]) == ([2, 7], 0)


def _hf(folder):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    return _hf(qwen3_tokenizer_dir)


@pytest.fixture(scope="module")
def llama3(llama3_tokenizer_dir):
    return _hf(llama3_tokenizer_dir)


def _long_sample():
    words = " ".join(f"word{i}" for i in range(3000))
    return dict(
        SAMPLE, context="START_OF_CONTEXT " + words + " END_OF_CONTEXT", input="What is it?"
    )


def _chat_overhead(tok):
    text = tok.apply_chat_template(
        [{"role": "user", "content": ""}], tokenize=False, add_generation_prompt=True
    )
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_qwen3_chat_and_truncation(qwen3):
    im_start = qwen3.convert_tokens_to_ids("<|im_start|>")
    overhead = _chat_overhead(qwen3)
    for dataset in DATASETS:
        p = build_prompt(qwen3, _long_sample(), dataset, 1000)
        assert p.truncated and p.raw_tokens > 1000
        text = qwen3.decode(p.ids)
        assert (p.ids[0] == im_start) == (dataset not in NO_CHAT_DATASETS), dataset
        assert text.endswith("<|im_start|>assistant\n") == p.chat
        # both ends kept, the middle dropped; re-tokenizing the seam may move a token or two
        assert "START_OF_CONTEXT" in text and "END_OF_CONTEXT" in text
        assert "word1500 " not in text
        assert abs(len(p.ids) - (overhead if p.chat else 0) - 1000) <= 3, (dataset, len(p.ids))


def test_qwen3_question_survives_truncation(qwen3):
    p = build_prompt(qwen3, _long_sample(), "hotpotqa", 600)
    text = qwen3.decode(p.ids)
    assert "Question: What is it?\nAnswer:" in text and "END_OF_CONTEXT" in text
    assert text.startswith("<|im_start|>user\nAnswer the question based on the given passages.")


def test_llama3_single_bos(llama3):
    bos = llama3.convert_tokens_to_ids("<|begin_of_text|>")
    for dataset in ("hotpotqa", "trec"):
        p = build_prompt(llama3, _long_sample(), dataset, 800)
        assert p.ids.count(bos) <= 1
        if p.chat:
            assert p.ids[0] == bos
            assert llama3.decode(p.ids).endswith(
                "<|start_header_id|>assistant<|end_header_id|>\n\n"
            )
        else:
            assert "<|start_header_id|>" not in llama3.decode(p.ids)
