"""The summary `make demo` ends with (`dustin_eval.demo`): built from real `dustin decode --json`
records of the small pair, a profile and a pg19 result of `pg19_eval.summarize`, it fits 80 x 30,
states each decoding's speed and tokens per step and each policy's perplexity ratio with its
interval; a missing output is one line on stderr and exit 2."""

import json
import random

from dustin_eval.demo import HEIGHT, WIDTH, main, summary
from dustin_eval.pg19_eval import summarize


def _pg19(folder):
    rng = random.Random(0)
    path = folder / "records-2048.jsonl"
    with path.open("w") as f:
        for window in range(3):
            for policy, budget in [("full", None)] + [(p, b) for p in ("dustin", "quest", "streamingllm")
                                                      for b in (256, 512, 1024)]:
                f.write(json.dumps({"policy": policy, "budget": budget, "book": "b", "window": window,
                                    "nll": 64 * rng.uniform(2.0, 3.0), "tokens": 64, "arr": rng.random()}) + "\n")
    return summarize(path, folder, 2048, 64, 4, {"target": "t", "draft": "d"})


def test_summary_fits_and_states_the_measured_numbers(small_models, write_profile, run_cli, tmp_path):
    t, d = str(small_models["target"]), str(small_models["draft"])
    write_profile(tmp_path / "profile.json", small_models["target"], small_models["draft"])
    pg19_profile = write_profile(tmp_path / "committed.json", small_models["target"], small_models["draft"],
                                 refresh_layers=[1])
    runs = {"plain": [], "full": ["--draft", d, "--policy", "full"],
            "dustin": ["--draft", d, "--profile", str(tmp_path / "profile.json")]}
    for name, extra in runs.items():
        out = run_cli("decode", "--target", t, "--prompt", "Once upon a time", "--max-new-tokens", "12", "--json",
                      *extra, ok=True).stdout
        (tmp_path / f"decode-{name}.json").write_text(out.strip().splitlines()[-1])
    (tmp_path / "pg19").mkdir()
    rows = _pg19(tmp_path / "pg19")
    lines = summary(tmp_path, pg19_profile)
    assert len(lines) <= HEIGHT and all(len(line) <= WIDTH for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    for name in runs:
        stats = json.loads((tmp_path / f"decode-{name}.json").read_text())["stats"]
        assert f"{stats['tokens_per_s']:7.2f} tokens/s{stats['mean_tokens_per_step']:6.2f} tokens/step" in text
    for r in rows:
        if r["policy"] != "full":
            assert f"{r['ppl_ratio']:.3f} [{r['ppl_ratio_lo']:.3f}, {r['ppl_ratio_hi']:.3f}]" in text
    assert "refresh 1" in text and "dustin bench e2e" in text and "results/speed-7b-32k/" in text
    assert main([str(tmp_path), str(pg19_profile)]) == 0
    assert (tmp_path / "summary.txt").read_text().splitlines() == lines


def test_a_missing_output_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "profile.json" in err[0] and "make demo" in err[0]
