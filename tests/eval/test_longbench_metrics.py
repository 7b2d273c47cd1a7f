"""LongBench metrics against hand-computed values (ROUGE-L through the rouge 1.0.1 package, code
similarity through fuzzywuzzy's difflib ratio, as LongBench runs them), and the committed LongBench
results re-scored: every sample and every summary score as committed."""

import json
from pathlib import Path

import pytest

from dustin_eval.jsonl import read_jsonl
from dustin_eval.longbench_config import DATASETS
from dustin_eval.longbench_metrics import (
    DATASET2METRIC,
    classification_score,
    code_sim_score,
    count_score,
    dataset_score,
    first_line,
    normalize_answer,
    qa_f1_score,
    retrieval_score,
    rouge_score,
    score_sample,
)

RESULTS = Path(__file__).resolve().parents[2] / "results"
SUMMARIES = sorted(RESULTS.glob("**/summary.json"))
LONGBENCH = [p for p in SUMMARIES if (p.parent / "predictions").is_dir()]

TREC_CLASSES = ["Description", "Entity", "Abbreviation", "Human being", "Location", "Numeric value"]


def test_normalize_answer_drops_case_punctuation_articles_and_spaces():
    assert normalize_answer("The  Cat's an-apple.") == "cats anapple"
    assert normalize_answer("A cat, AN owl; the end!") == "cat owl end"
    assert normalize_answer("theme and anthem") == "theme and anthem"  # whole words only


def test_qa_f1_hand_computed():
    # "eiffel tower in paris" vs "eiffel tower": p = 2/4, r = 2/2, F1 = 2/3
    assert qa_f1_score("The Eiffel Tower, in Paris!", "Eiffel tower") == pytest.approx(2 / 3)
    assert qa_f1_score("a cat", "the cat.") == 1.0
    # bag of tokens: one "paris" matches, p = 1/3, r = 1
    assert qa_f1_score("paris paris london", "Paris") == pytest.approx(0.5)
    assert qa_f1_score("London", "Paris") == 0.0
    assert qa_f1_score("the", "Paris") == 0.0  # empty after normalisation


def test_rouge_l_hand_worked_pair():
    # words as sets: ref {the, cat, is, on, mat} = 5, hyp {the, cat, sat, on, mat} = 5,
    # LCS "the cat on the mat" -> {the, cat, on, mat} = 4: P = R = 0.8, F = 0.8 (minus 1e-8 term)
    assert rouge_score("the cat sat on the mat", "the cat is on the mat") == pytest.approx(
        0.8, abs=1e-7
    )


def test_rouge_l_sentence_union_and_case():
    # sentences split on "."; union LCS over (ref sentence, hyp sentence) pairs; case-sensitive:
    # union {park, stayed, open, arrested, protesters} = 5 of 8 words each side -> 0.625
    pred = "police arrested five protesters. the park stayed open"
    ref = "The park stayed open. Police arrested protesters downtown"
    assert rouge_score(pred, ref) == pytest.approx(0.625, abs=1e-7)
    assert rouge_score("a b c. d e", "a c e. b d") == pytest.approx(1.0, abs=1e-7)
    assert rouge_score("the the the", "the") == pytest.approx(1.0, abs=1e-7)  # set semantics


def test_rouge_l_empty_is_zero():
    assert rouge_score("", "the cat") == 0.0
    assert rouge_score("...", "the cat") == 0.0
    assert rouge_score("x", ".") == 0.0
    assert rouge_score("the cat", "the dog") == pytest.approx(0.5, abs=1e-7)


def test_classification_with_all_classes():
    assert classification_score("Location", "Location", all_classes=TREC_CLASSES) == 1.0
    assert classification_score("Location or Entity", "Location", all_classes=TREC_CLASSES) == 0.5
    assert classification_score("Entity", "Location", all_classes=TREC_CLASSES) == 0.0
    assert classification_score("no idea", "Location", all_classes=TREC_CLASSES) == 0.0
    # a class that is a proper substring of the truth is dropped from the matches
    assert (
        classification_score("Human being", "Human being", all_classes=["Human", "Human being"])
        == 1.0
    )
    # the reference removes while iterating: after dropping "Hu" it skips "Human" -> 1/2
    classes = ["Hu", "Human", "Human being"]
    assert classification_score("Human being", "Human being", all_classes=classes) == 0.5


def test_retrieval_paragraph_number():
    assert retrieval_score("Paragraph 3", "Paragraph 3") == 1.0
    assert retrieval_score("Paragraph 3 or Paragraph 12", "Paragraph 3") == 0.5
    assert retrieval_score("Paragraph 30", "Paragraph 3") == 0.0
    assert retrieval_score("I do not know", "Paragraph 3") == 0.0


def test_count_share_of_numbers():
    assert count_score("There are 7 unique paragraphs", "7") == 1.0
    assert count_score("7 or 8", "7") == 0.5
    assert count_score("17", "7") == 0.0
    assert count_score("none", "7") == 0.0


def test_code_similarity_is_difflibs_ratio():
    # fuzz.ratio = round(100 * 2 * matches / total length), difflib's SequenceMatcher
    assert code_sim_score("abcd", "abce") == 0.75  # 2 * 3 / 8
    assert code_sim_score("foo(x)", "foo(y)") == 0.83  # 2 * 5 / 12 = 83.3
    assert code_sim_score("abcdefgh", "abcdeXYZ") == 0.62  # 62.5 rounds half to even
    assert code_sim_score("", "x") == 0.0


def test_code_sim_first_code_line():
    assert code_sim_score("# comment\n`x`\na // b\nreturn a + b\n", "return a + b") == 1.0
    assert code_sim_score("\n\nfoo(x)\nbar()", "foo(y)") == 0.83
    assert code_sim_score("# only a comment", "foo(y)") == 0.0


def test_first_line_cut():
    assert first_line("\n\nLocation\nEntity") == "Location"
    assert score_sample("trec", "\n\nLocation\nEntity", ["Location"], TREC_CLASSES) == 1.0
    assert score_sample("triviaqa", "\nParis\nLondon is big", ["Paris"]) == 1.0
    assert score_sample("samsum", "the cat\nsat", ["the cat"]) == pytest.approx(1.0, abs=1e-7)
    # no cut on hotpotqa: "paris london" vs "paris" -> 2/3
    assert score_sample("hotpotqa", "Paris\nLondon", ["Paris"]) == pytest.approx(2 / 3)


def test_best_over_ground_truths():
    assert score_sample("hotpotqa", "Paris", ["London", "Paris France", "paris"]) == 1.0
    assert score_sample("hotpotqa", "Paris", ["London", "Paris France"]) == pytest.approx(2 / 3)
    assert score_sample("passage_count", "5", ["4"]) == 0.0


def test_dataset_score_mean_times_100_rounded():
    assert dataset_score([1.0, 0.5, 0.0, 1 / 3]) == 45.83
    assert dataset_score([2 / 3]) == 66.67
    with pytest.raises(ValueError):
        dataset_score([])


def test_every_dataset_has_its_metric():
    assert set(DATASET2METRIC) == set(DATASETS)
    assert DATASET2METRIC["multi_news"] is rouge_score
    assert DATASET2METRIC["trec"] is classification_score
    assert DATASET2METRIC["passage_retrieval_en"] is retrieval_score
    assert DATASET2METRIC["lcc"] is DATASET2METRIC["repobench-p"] is code_sim_score


def test_the_committed_longbench_results_exist():
    assert len(LONGBENCH) >= 2, LONGBENCH  # results/longbench and results/retrieval-passkey/longbench


@pytest.mark.parametrize("summary", LONGBENCH, ids=lambda p: str(p.parent.relative_to(RESULTS)))
def test_committed_scores_rescore_equal(summary):
    """Every committed prediction re-scored gives its committed score, and every summary row the
    mean of its run's scores (x 100, 2 decimals)."""
    rows = json.loads(summary.read_text())["rows"]
    assert rows
    for row in rows:
        run = f"{row['policy']}-{'full' if row['budget'] is None else row['budget']}"  # RunMeta.run_name
        recs = read_jsonl(summary.parent / "predictions" / run / f"{row['dataset']}.jsonl")
        assert len(recs) == row["n"]
        for rec in recs:
            got = score_sample(rec["dataset"], rec["pred"], rec["answers"], rec.get("all_classes"))
            assert got == rec["score"], (run, rec["_id"])
        assert dataset_score([r["score"] for r in recs]) == row["score"], run
