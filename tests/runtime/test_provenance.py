"""Provenance: the git commit (and its override), versions, device, the record of a result."""

import re
import sys

from dustin_runtime.io.provenance import REPO, git_commit, provenance, versions


def test_provenance_fields():
    prov = provenance(models={"target": "Qwen/Qwen2.5-7B"}, shapes={"batch": 16, "context": 32768})
    assert prov["models"] == {"target": "Qwen/Qwen2.5-7B"}
    assert prov["shapes"] == {"batch": 16, "context": 32768}
    assert prov["command"] == sys.argv
    assert prov["device"] and "device_count" in prov
    assert prov["versions"]["torch"] and prov["versions"]["transformers"]
    assert prov["versions"] == versions()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", prov["timestamp"])
    assert prov["git_commit"] == git_commit()


def test_git_commit_in_repo_and_fallback(tmp_path, monkeypatch):
    monkeypatch.delenv("DUSTIN_GIT_COMMIT", raising=False)
    commit = git_commit(REPO)
    if (REPO / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    monkeypatch.setenv("DUSTIN_GIT_COMMIT", "abc123")
    assert git_commit(tmp_path) == "abc123"  # not a git work tree
    assert git_commit(REPO) == "abc123"  # set by device commands: it wins over a lagging .git
    assert provenance()["git_commit"] == "abc123"
    monkeypatch.delenv("DUSTIN_GIT_COMMIT")
    assert git_commit(tmp_path) == "unknown"
    monkeypatch.setenv("PATH", "")  # no git at all
    assert git_commit(REPO) == "unknown"

