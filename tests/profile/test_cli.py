"""`dustin profile` and `dustin profile show` in a subprocess: a run, its tables, and bad artifacts
refused with one clear line."""

import json

import pytest

from dustin_profile.artifact import load_profile
from dustin_runtime.errors import DustinError


@pytest.fixture(scope="module")
def made(models, calib_text, tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("cli") / "p.json"
    p = run_cli("profile", "--target", str(models["target"]), "--draft", str(models["draft"]), "--calib", str(calib_text),
                "--context", "128", "--windows", "1", "--budget", "40",
                "--sinks", "2", "--window", "8", "--max-heads", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    return out, p


def test_profile_run_prints_tables(made):
    out, p = made
    assert "ARR at S = 40" in p.stdout and "greedy rounds" in p.stdout and "wrote" in p.stdout
    assert "memory: plan " in p.stdout and "peak" not in p.stdout  # no peak on CPU
    prof = load_profile(out)
    assert prof.calibration["run"]["command"].startswith("dustin profile --target")


def test_show_and_check_against_models(made, models, run_cli, assert_one_line_error):
    out, _ = made
    p = run_cli("profile", "show", str(out), "--target", str(models["target"]), "--draft", str(models["draft"]))
    assert p.returncode == 0, p.stderr
    assert "retrieval heads" in p.stdout and "ARR vs budget" in p.stdout and "matches" in p.stdout
    assert_one_line_error(run_cli("profile", "show", str(out), "--target", str(models["other"])),
                          "was made for target", "not")


def test_bad_artifacts_refused(made, tmp_path, run_cli, assert_one_line_error):
    out, _ = made
    good = json.loads(out.read_text())
    cases = {
        "schema": ({**good, "schema_version": 99}, "schema_version 99 is not supported", True),
        "missing": ({k: v for k, v in good.items() if k not in ("m", "target_heads")},
                    "missing field(s) m, target_heads", True),
        "heads": ({**good, "target_heads": [{"layer": 99, "kv_head": 0, "query_heads": [0]}]}, "outside the model", False),
        "m": ({**good, "m": 10_000}, "is outside [0, budget - sinks - window]", False),
    }
    for name, (d, needle, cli) in cases.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(d))
        with pytest.raises(DustinError) as e:
            load_profile(f)
        assert needle in str(e.value) and "\n" not in str(e.value)
        if cli:
            assert_one_line_error(run_cli("profile", "show", str(f)), needle)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(DustinError, match="not a readable JSON profile"):
        load_profile(tmp_path / "junk.json")
    with pytest.raises(DustinError, match="no such profile file"):
        load_profile(tmp_path / "none.json")


def test_profile_usage_errors(run_cli, assert_one_line_error):
    assert_one_line_error(run_cli("profile", "--target", "x"), "needs --target and --draft")
    p = run_cli("profile", "--help")
    assert p.returncode == 0 and "--target" in p.stdout and "show" in p.stdout


def test_show_prints_only_what_the_profile_proves(run_cli):
    """The committed profile (made on another machine, without an installed version) shows no
    'dustin unknown' and none of its author's absolute paths."""
    p = run_cli("profile", "show", "profiles/smollm2-draft.json", ok=True)
    assert "made by" in p.stdout and "schema 3" in p.stdout
    assert "dustin unknown" not in p.stdout and "/tmp/" not in p.stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (on the machine that made it)" in p.stdout


def test_profile_runs_on_random_presets(calib_text, run_cli, tmp_path):
    out = tmp_path / "p.json"
    p = run_cli("profile", "--target", "random:smollm2", "--draft", "random:smollm2", "--calib", str(calib_text),
                "--context", "96", "--windows", "1", "--budget", "40", "--sinks", "2", "--window", "8",
                "--max-heads", "1", "--out", str(out), ok=True)
    assert "memory: plan" in p.stdout and out.is_file()


def test_profile_at_2_ranks_equals_one_process(made, models, calib_text, tp_run, tmp_path):
    """`dustin profile --tp 2` as torchrun starts it (gloo): the target sharded by KV heads, the records
    gathered; the same heads, m and baselines as one process, ARR within float rounding; rank 0 writes."""
    one_out, _ = made
    out = tmp_path / "tp.json"
    args = ["profile", "--target", str(models["target"]), "--draft", str(models["draft"]), "--calib", str(calib_text),
            "--context", "128", "--windows", "1", "--budget", "40", "--sinks", "2", "--window", "8",
            "--max-heads", "2", "--out", str(out), "--tp", "2"]
    ranks = tp_run.cli(2, *args)
    assert [rc for rc, _, _ in ranks] == [0, 0], ranks[0][2] + ranks[1][2]
    assert "memory: plan" in ranks[0][1] and ranks[1][1] == ""
    one, tp = load_profile(one_out), load_profile(out)
    assert (tp.draft_heads, tp.target_heads, tp.m, tp.m_by_budget) == \
        (one.draft_heads, one.target_heads, one.m, one.m_by_budget)
    assert tp.arr == pytest.approx(one.arr, abs=1e-5)
    for k, v in one.arr_baselines.items():
        assert tp.arr_baselines[k] == pytest.approx(v, abs=1e-5), k
    assert tp.calibration["run"]["tp"] == 2 and tp.calibration["sha256"] == one.calibration["sha256"]
    ranks = tp_run.cli(2, *args)  # resumed: nothing recorded again
    assert ranks[0][0] == 0 and "(0 windows recorded, 1 resumed)" in ranks[0][1], ranks[0][2]
