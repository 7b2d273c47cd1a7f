"""A new user's first hour, scripted: in a fresh clone (the last commit, as `git clone` gives it),
profile a tiny pair, decode with the profile, then `eval pg19` (twice: the second run resumes),
`eval longbench --limit 1` and `eval acceptance` with tiny settings, every output at its default
path. Every command must exit 0 and the clone's `git status --porcelain` must stay empty: a default
that writes into tracked files, or anywhere not git-ignored, fails it. The clone's own code runs
(plain subprocesses, its folder first on PYTHONPATH), so a default resolved beside the package is
caught as well as one resolved in the working folder."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = "The river ran past the house every morning, and the miller counted the sacks. " * 300
SMALL = dict(vocab_size=1024, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
             initializer_range=0.3)  # weights large enough for peaked attention: the profile finds heads


def tiny_pair(make_tiny_hf, tokenizer, root: Path) -> tuple[str, ...]:
    """A tiny random target (2 layers) and draft (1 layer) sharing the small tokenizer."""
    for name, seed, over in (("target", 0, {}), ("draft", 1, dict(num_hidden_layers=1, num_attention_heads=2,
                                                                    num_key_value_heads=1))):
        make_tiny_hf("llama3", root / name, seed, **{**SMALL, **over})
        for f in tokenizer.iterdir():
            shutil.copy(f, root / name / f.name)
    return "--target", str(root / "target"), "--draft", str(root / "draft")


def test_first_hour_in_a_fresh_clone_leaves_git_status_clean(make_tiny_hf, small_tokenizer, tmp_path):
    clone = tmp_path / "dustin"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    books = tmp_path / "books"
    books.mkdir()
    (books / "river.txt").write_text(TEXT)
    longbench = tmp_path / "longbench"  # one LongBench v1 file of one sample (trec: 64 new tokens at most)
    longbench.mkdir()
    (longbench / "trec.jsonl").write_text(json.dumps({
        "input": "What river ran past the house?", "context": TEXT[:2000], "answers": ["Location"], "length": 400,
        "dataset": "trec", "language": "en", "all_classes": ["Location", "Person"], "_id": "t0"}) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(clone), str(clone / "kernels")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONIOENCODING": "utf-8",
           "DUSTIN_CACHE": str(tmp_path / "cache")}

    def dustin(*args: str) -> str:
        p = subprocess.run([sys.executable, "-m", "dustin.cli", *map(str, args)], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (args, p.stderr[-2000:])
        return p.stdout

    where = subprocess.run([sys.executable, "-c", "import dustin, dustin_kernels; print(dustin.__file__, "
                            "dustin_kernels.__file__)"], cwd=clone, env=env, capture_output=True, text=True)
    assert where.stdout.split() == [str(clone / "dustin" / "__init__.py"),
                                    str(clone / "kernels" / "dustin_kernels" / "__init__.py")], where.stderr
    pair = tiny_pair(make_tiny_hf, small_tokenizer, tmp_path)
    dustin("profile", *pair, "--calib", books, "--context", "128", "--windows", "2", "--budget", "40",
           "--sinks", "2", "--window", "8")
    made = clone / "runs" / "profile" / "target-draft.json"
    assert made.is_file()
    out = dustin("decode", *pair, "--profile", made, "--prompt", "The river", "--max-new-tokens", "8")
    assert "policy dustin" in out  # the profile implies its policy
    pg19 = ("eval", "pg19", *pair, "--data", books, "--context", "48", "--eval-tokens", "10", "--windows", "1",
            "--budget", "40")
    dustin(*pg19)  # the pair's profile found at runs/profile/<target>-<draft>.json
    dustin(*pg19)  # resumed from its records
    dustin("eval", "longbench", *pair, "--data", longbench, "--limit", "1", "--budget", "40")
    dustin("eval", "acceptance", *pair, "--data", books, "--contexts", "64", "--budget", "40", "--windows", "1",
           "--max-new-tokens", "6")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone,
                            capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout
    assert (clone / "runs" / "pg19").is_dir() and (clone / "runs" / "longbench" / "summary.csv").is_file() and any((clone / "runs" / "acceptance").glob("*.json"))
