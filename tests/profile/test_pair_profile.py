"""The profile an eval command reads when --profile is not given (`plan.pair_profile`): the one
`dustin profile` wrote by default (runs/profile/<target>-<draft>.json, below the working folder),
else the committed one (profiles/<target>-<draft>.json, or profiles/<draft>.json as the embedded
pair's is named); none for policies that read no heads."""

from dustin_profile.plan import REPO, pair_profile


def test_embedded_pair_finds_the_committed_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ here
    assert pair_profile(None, "smollm2", "models/smollm2-draft", ["full", "dustin"]) == \
        REPO / "profiles" / "smollm2-draft.json"
    assert pair_profile(None, "smollm2", "models/smollm2-draft", ["full", "streamingllm"]) is None
    assert pair_profile(None, "/x/nobody", "/y/nothing", ["dustin"]) is None
    assert pair_profile("mine.json", "smollm2", "models/smollm2-draft", ["full"]).name == "mine.json"


def test_the_default_output_of_dustin_profile_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = tmp_path / "runs" / "profile" / "smollm2-smollm2-draft.json"
    made.parent.mkdir(parents=True)
    made.write_text("{}")
    assert pair_profile(None, "smollm2", "models/smollm2-draft", ["dustin"]).resolve() == made.resolve()
