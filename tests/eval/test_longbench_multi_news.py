"""The real LongBench multi_news.jsonl from ../shared: loading, prompts, ROUGE-L, the runner."""

import pytest

from dustin_eval.jsonl import read_jsonl
from dustin_eval.longbench_data import FIELDS, build_prompt, load_dataset
from dustin_eval.longbench_metrics import rouge_score
from dustin_eval.longbench_runner import RunMeta, run_longbench


@pytest.fixture(scope="module")
def samples(multi_news_jsonl):
    return load_dataset(multi_news_jsonl.parent, "multi_news")


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


def test_load_all_200(samples):
    assert len(samples) == 200
    assert all(set(FIELDS) <= set(s) for s in samples)
    assert all(s["dataset"] == "multi_news" and s["all_classes"] is None for s in samples)
    assert len({s["_id"] for s in samples}) == 200
    assert samples[0]["_id"] == "e45abfcb82a3c862c0f772e6f461866839955c11ea2f46a8"


def test_rouge_l_on_real_answers(samples):
    a0, a1 = samples[0]["answers"][0], samples[1]["answers"][0]
    # values of rouge 1.0.1 (`Rouge().get_scores([p], [g], avg=True)["rouge-l"]["f"]`)
    assert rouge_score(a1, a0) == pytest.approx(0.14788731908649094, abs=1e-12)
    assert rouge_score(". ".join(a0.split(". ")[:3]), a0) == pytest.approx(
        0.6888888843728397, abs=1e-12
    )
    assert rouge_score(a0, a0) == pytest.approx(1.0, abs=1e-7)


def test_prompts_truncate_in_the_middle(samples, qwen3):
    for s in samples[:4]:
        p = build_prompt(qwen3, s, "multi_news", 2048)
        text = qwen3.decode(p.ids)
        assert p.truncated == (p.raw_tokens > 2048)
        assert text.startswith("<|im_start|>user\nYou are given several news passages.")
        assert text.endswith(
            "Now, write a one-page summary of all the news.\n\nSummary:<|im_end|>\n<|im_start|>assistant\n"
        )
        assert len(p.ids) <= 2048 + 16


def test_runner_with_an_oracle(tmp_path, samples, qwen3, scripted_generator, multi_news_jsonl):
    heads = {s["context"][:200]: s["answers"][0] for s in samples[:3]}

    def respond(prompt):
        return next(a for head, a in heads.items() if head in prompt)

    gen = scripted_generator(qwen3, respond)
    meta = RunMeta(policy="full", budget=None, target="test-oracle")
    rows = run_longbench(
        gen,
        qwen3,
        meta,
        data_dir=multi_news_jsonl.parent,
        out_dir=tmp_path,
        max_length=4096,
        datasets=["multi_news"],
        limit=3,
    )
    assert rows[0]["n"] == 3 and rows[0]["score"] == 100.0
    recs = read_jsonl(tmp_path / "predictions" / "full-full" / "multi_news.jsonl")
    assert all(r["prompt_tokens"] <= 4096 - 512 + 16 for r in recs)
    assert gen.calls[0]["max_new_tokens"] == [512]
