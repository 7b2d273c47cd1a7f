"""Profile.to_sparse_config: the profile's heads and aggregation, its calibrated m where it has
one, else m scaled by the runtime's one rule (the same as SparseConfig.with_budget), clipped when
sinks/window are overridden; and field types refused at load time."""

import json

import pytest

from dustin_profile.artifact import load_profile
from dustin_runtime.errors import DustinError

from .profile_cases import profile


def test_to_sparse_config():
    p = profile()
    cfg = p.to_sparse_config(source="p.json")
    assert (cfg.budget, cfg.sinks, cfg.window, cfg.m, cfg.aggregation, cfg.source) == (512, 4, 64, 111, "max", "p.json")
    assert cfg.draft_heads == ((0, 1, (2, 3)),) and cfg.target_heads == ((1, 0, (0, 1)),)
    assert p.to_sparse_config(256).m == 50  # calibrated at that budget
    for budget in (128, 1024, 4096):  # scaled: the runtime's rule, one definition
        assert p.to_sparse_config(budget).m == cfg.with_budget(budget).m
    assert p.to_sparse_config(1024).m == round(111 / 444 * 956)
    small = p.to_sparse_config(128, sinks=4, window=120)  # overridden: clipped to the 4 free rows
    assert small.m == 4 and small.free == 4
    with pytest.raises(DustinError, match="smaller than sinks \\+ window"):
        p.to_sparse_config(32)


def test_content_hash_ignores_when_and_how_long():
    p = profile(calibration={"sha256": "x", "run": {"seconds": 1}})
    again = profile(created="later", git_commit="other", calibration={"sha256": "x", "run": {"seconds": 2}})
    assert p.content_hash() == again.content_hash()
    assert p.content_hash() != profile(calibration={"sha256": "y"}).content_hash() != profile(m=3).content_hash()


def test_no_heads():
    assert profile().has_heads and not profile(draft_heads=(), target_heads=()).has_heads


@pytest.mark.parametrize("field,value,needle", [
    ("sinks", "4", "field sinks must be an integer"), ("budget", None, "field budget must be an integer"),
    ("window", 64.0, "field window must be an integer"), ("gamma", False, "field gamma must be an integer"),
    ("arr", "0.9", "field arr must be a number"), ("m_by_budget", {"256": "50"}, "m_by_budget must map"),
    ("gamma", 0, "gamma 0 and budget 512 must be >= 1"), ("sinks", -1, "sinks -1 and window 64 >= 0"),
    ("m_by_budget", {"256": 500}, "m_by_budget[256] is outside"),
])
def test_wrong_types_and_ranges_refused(tmp_path, field, value, needle):
    d = {**profile().to_dict(), field: value}
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(DustinError) as e:
        load_profile(tmp_path / "p.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_round_trip_and_atomic_save(tmp_path):
    p = profile()
    path = p.save(tmp_path / "sub" / "p.json")
    assert load_profile(path) == p and [f.name for f in path.parent.iterdir()] == ["p.json"]


def test_schema_1_loads_unchanged(tmp_path):
    d = profile().to_dict()
    d.pop("heldout")
    (tmp_path / "v1.json").write_text(json.dumps({**d, "schema_version": 1}))
    p = load_profile(tmp_path / "v1.json")
    assert p.schema_version == 1 and p.to_sparse_config() == profile().to_sparse_config()


@pytest.mark.parametrize("field,unused,used,feature", [
    ("groups", [], [{"start": 0, "stop": 1}, {"start": 1, "stop": 2}], "layer groups"),
    ("draft_group", 0, 1, "layer groups"),
    ("score_channels", [], [[[0]], [[1]]], "score channels"),
    ("refresh_kv_heads", [], [[0]], "refresh layers scored by some KV heads"),
])
def test_fields_of_dropped_features_ignored_when_unused_refused_when_used(tmp_path, field, unused, used, feature):
    """A schema-7 profile loads with a dropped feature's field at its unused value (the field is
    not kept) and is refused, in one line naming the feature, where it uses it."""
    d = {**profile().to_dict(), "schema_version": 7, field: unused}
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert load_profile(tmp_path / "old.json").to_sparse_config() == profile().to_sparse_config()
    (tmp_path / "used.json").write_text(json.dumps({**d, field: used}))
    with pytest.raises(DustinError) as e:
        load_profile(tmp_path / "used.json")
    assert f"uses {feature}" in str(e.value) and "\n" not in str(e.value)


def test_unknown_schema_refused(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({**profile().to_dict(), "schema_version": 4}))
    with pytest.raises(DustinError, match="reads 1, 2, 3, 5, 6, 7, 8"):
        load_profile(tmp_path / "p.json")
