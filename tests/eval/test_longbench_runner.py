"""The LongBench runner end to end with test doubles: records, resume after a crash, summary."""

import csv
import json

import pytest

from dustin_eval.jsonl import read_jsonl
from dustin_eval.longbench_runner import RunMeta, run_longbench, summarize_predictions
from dustin_runtime.errors import DustinError

TREC_CLASSES = ["Description", "Entity", "Location", "Human being"]


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _sample(dataset, i, context, question, answers, all_classes=None):
    return {
        "input": question,
        "context": context,
        "answers": answers,
        "length": len(context.split()),
        "dataset": dataset,
        "language": "en",
        "all_classes": all_classes,
        "_id": f"{dataset}-{i}",
    }


@pytest.fixture()
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    _write(
        d / "hotpotqa.jsonl",
        [
            _sample(
                "hotpotqa",
                i,
                f"Passage {i}: the capital is City{i}.",
                f"capital {i}?",
                [f"City{i}"],
            )
            for i in range(5)
        ],
    )
    _write(
        d / "trec.jsonl",
        [
            _sample(
                "trec",
                i,
                "Q: who? Type: Human being",
                f"Q: item {i}\nType:",
                ["Location"],
                TREC_CLASSES,
            )
            for i in range(3)
        ],
    )
    _write(
        d / "samsum.jsonl",
        [
            _sample(
                "samsum",
                0,
                "Dialogue: A: hi\nSummary: A greets.",
                "Dialogue: B: bye\nSummary:",
                ["B leaves"],
            )
        ],
    )
    return d


def oracle(prompt: str) -> str:
    # Reads the sample number out of the prompt; answers right for even samples, wrong for odd.
    if "capital" in prompt:
        i = int(prompt.rsplit("capital ", 1)[1].split("?")[0])
        return f"City{i}" if i % 2 == 0 else "Nowhere"
    if "Type:" in prompt:
        return "Location\nEntity"  # first-line cut keeps "Location"
    return "B leaves\nDialogue: more"


META = RunMeta(policy="dustin", budget=512, target="fake/target", draft="fake/draft")


def test_run_writes_records_scores_and_summary(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    gen = scripted_generator(tok, oracle)
    out = tmp_path / "out"
    rows = run_longbench(gen, tok, META, data_dir=data_dir, out_dir=out, max_length=4096,
                         datasets=["hotpotqa", "trec", "samsum"], batch_size=2)
    by = {r["dataset"]: r for r in rows}
    assert by["hotpotqa"]["score"] == 60.0 and by["hotpotqa"]["n"] == 5  # 3 of 5 right
    assert by["trec"]["score"] == 100.0
    assert by["samsum"]["score"] == pytest.approx(100.0)
    assert by["hotpotqa"]["mean_accept_len"] == 2.0

    recs = read_jsonl(out / "predictions" / "dustin-512" / "hotpotqa.jsonl")
    assert [r["_id"] for r in recs] == [f"hotpotqa-{i}" for i in range(5)]
    assert recs[0]["pred"] == "City0" and recs[1]["score"] == 0.0
    assert (
        recs[0]["policy"] == "dustin"
        and recs[0]["budget"] == 512
        and recs[0]["target"] == "fake/target"
    )
    assert recs[0]["stats"] == {"accept_len": 2.0, "steps": 3}

    # batching and per-dataset generation settings reached the generator
    assert [len(c["prompts"]) for c in gen.calls] == [2, 2, 1, 2, 1, 1]
    assert gen.calls[0]["max_new_tokens"] == [32, 32] and gen.calls[0]["eos_ids"] == [2]
    assert gen.calls[-1]["eos_ids"] == [2, ord("\n") + 3] and gen.calls[-1]["min_new_tokens"] == 1
    assert tok.decode(gen.calls[0]["prompts"][0]).startswith("<user>")  # hotpotqa: chat
    assert not tok.decode(gen.calls[4]["prompts"][0]).startswith("<user>")  # trec: no chat

    with open(out / "summary.csv") as f:
        table = list(csv.DictReader(f))
    assert {(r["dataset"], r["policy"], r["budget"], r["score"]) for r in table} >= {
        ("hotpotqa", "dustin", "512", "60.0")
    }
    md = (out / "summary.md").read_text()
    assert "| dataset | dustin@512 |" in md and "| hotpotqa | 60 |" in md
    assert "average (3 datasets)" in md and "- command:" in md
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["schema_version"] == 1
        and summary["provenance"]["models"]["target"] == "fake/target"
    )
    run = json.loads((out / "predictions" / "dustin-512" / "run.json").read_text())
    assert run["policy"] == "dustin" and len(run["invocations"]) == 1


def test_resume_after_crash(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    out = tmp_path / "out"
    crashing = scripted_generator(tok, oracle, fail_on_call=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_longbench(crashing, tok, META, data_dir=data_dir, out_dir=out, max_length=4096, datasets=["hotpotqa"])
    path = out / "predictions" / "dustin-512" / "hotpotqa.jsonl"
    assert [r["_id"] for r in read_jsonl(path)] == ["hotpotqa-0", "hotpotqa-1"]

    with open(path, "a") as f:  # a crash in the middle of a write leaves a torn line
        f.write('{"_id": "hotpotqa-2", "pred": "Cit')
    assert len(read_jsonl(path)) == 2

    good = scripted_generator(tok, oracle)
    rows = run_longbench(
        good, tok, META, data_dir=data_dir, out_dir=out, max_length=4096, datasets=["hotpotqa"]
    )
    assert len(good.calls) == 3  # only the samples not finished before
    ids = [r["_id"] for r in read_jsonl(path)]
    assert ids == [f"hotpotqa-{i}" for i in range(5)]
    assert path.read_text().endswith("}\n")
    assert rows[0]["n"] == 5 and rows[0]["score"] == 60.0

    again = scripted_generator(tok, oracle)
    run_longbench(
        again, tok, META, data_dir=data_dir, out_dir=out, max_length=4096, datasets=["hotpotqa"]
    )
    assert again.calls == []


def test_policies_and_budgets_in_one_summary(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    out = tmp_path / "out"
    for policy, budget in (("full", None), ("dustin", 256), ("dustin", 1024)):
        meta = RunMeta(policy=policy, budget=budget, target="t", draft="d")
        run_longbench(scripted_generator(tok, oracle), tok, meta, data_dir=data_dir, out_dir=out, max_length=4096,
                      datasets=["hotpotqa", "trec"])
    rows = summarize_predictions(out)
    assert [(r["policy"], r["budget"], r["dataset"]) for r in rows] == [
        ("dustin", 256, "hotpotqa"),
        ("dustin", 256, "trec"),
        ("dustin", 1024, "hotpotqa"),
        ("dustin", 1024, "trec"),
        ("full", None, "hotpotqa"),
        ("full", None, "trec"),
    ]
    assert (out / "predictions" / "full-full" / "trec.jsonl").exists()
    assert "| dataset | dustin@256 | dustin@1024 | full@full |" in (out / "summary.md").read_text()


def test_truncation_to_max_length_minus_generation(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    gen = scripted_generator(tok, lambda p: "x")
    # trec generates up to 64 tokens: a max length of 60 leaves no room for the prompt
    with pytest.raises(DustinError, match="no room"):
        run_longbench(gen, tok, META, data_dir=data_dir, out_dir=tmp_path / "o1", max_length=60, datasets=["trec"])
    run_longbench(gen, tok, META, data_dir=data_dir, out_dir=tmp_path / "o2", max_length=64 + 40,
                  datasets=["trec", "hotpotqa"])
    trec = read_jsonl(tmp_path / "o2" / "predictions" / "dustin-512" / "trec.jsonl")
    assert all(r["truncated"] and r["prompt_tokens"] == 40 for r in trec)
    # hotpotqa: 32 new tokens -> 72 tokens, BOS decoded away, then the chat template's characters
    hotpot = read_jsonl(tmp_path / "o2" / "predictions" / "dustin-512" / "hotpotqa.jsonl")
    chat = len("<user></user><assistant>")
    assert all(r["truncated"] and r["prompt_tokens"] == 71 + chat for r in hotpot)
    assert all(c["max_new_tokens"] == [64] for c in gen.calls[:3])
    assert all(c["max_new_tokens"] == [32] for c in gen.calls[3:])


def test_other_run_in_same_folder_is_refused_then_restart(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    out = tmp_path / "out"
    kw = dict(data_dir=data_dir, out_dir=out, max_length=4096, datasets=["trec"], limit=1)
    run_longbench(scripted_generator(tok, oracle), tok, META, resume_key={"gamma": 4}, **kw)
    other = RunMeta(policy="dustin", budget=512, target="another/target", draft="fake/draft")
    with pytest.raises(DustinError, match=r'other settings \(target: "fake/target" -> "another/target"\).*--restart'):
        run_longbench(scripted_generator(tok, oracle), tok, other, resume_key={"gamma": 4}, **kw)
    with pytest.raises(DustinError, match=r"other settings \(gamma: 4 -> 5\)"):
        run_longbench(scripted_generator(tok, oracle), tok, META, resume_key={"gamma": 5}, **kw)
    path = out / "predictions" / "dustin-512" / "trec.jsonl"
    assert [r["target"] for r in read_jsonl(path)] == ["fake/target"]  # nothing was mixed in
    gen = scripted_generator(tok, oracle)
    run_longbench(gen, tok, other, restart=True, **kw)
    assert len(gen.calls) == 1 and [r["target"] for r in read_jsonl(path)] == ["another/target"]


def test_bad_inputs(tmp_path, data_dir, char_tokenizer, scripted_generator):
    tok = char_tokenizer
    gen = scripted_generator(tok, oracle)
    with pytest.raises(DustinError, match="not found"):
        run_longbench(gen, tok, META, data_dir=data_dir, out_dir=tmp_path / "o", max_length=4096,
                      datasets=["qasper"])
    with pytest.raises(DustinError, match="unknown LongBench dataset"):
        run_longbench(gen, tok, META, data_dir=data_dir, out_dir=tmp_path / "o", max_length=4096,
                      datasets=["multifieldqa_zh"])
    (data_dir / "musique.jsonl").write_text('{"input": "x"}\n')
    with pytest.raises(DustinError, match="missing field"):
        run_longbench(gen, tok, META, data_dir=data_dir, out_dir=tmp_path / "o", max_length=4096,
                      datasets=["musique"])
