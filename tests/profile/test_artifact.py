"""Profile.to_sparse_config: the profile's heads and aggregation, its calibrated m where it has
one, else m scaled by the runtime's one rule (the same as SparseConfig.with_budget), clipped when
sinks/window are overridden; and field types refused at load time."""

import json

import pytest

from dustin_profile.artifact import GroupChoice, HeadChoice, load_profile
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


def grouped(**kw):
    g0 = GroupChoice(0, 1, 100, {256: 40}, (HeadChoice(0, 1, (2, 3)),), (HeadChoice(1, 0, (0, 1)),), 0.8)
    g1 = GroupChoice(1, 2, 0, {}, (), (HeadChoice(0, 1, (2, 3)), HeadChoice(1, 1, (2,))), 0.9)
    return profile(groups=(g0, g1), draft_group=1, **kw)


def test_layer_groups_to_sparse_config_and_round_trip(tmp_path):
    p = grouped()
    assert p.arr_layers == pytest.approx(0.85) and profile().arr_layers == 0.9
    cfg = p.to_sparse_config()
    assert (cfg.m, cfg.draft_heads, cfg.target_heads, cfg.draft_group) == (0, (), (), 1)
    g0, g1 = cfg.layer_groups
    assert (g0.start, g0.m, g0.draft_heads, g0.target_heads) == (0, 100, ((0, 1, (2, 3)),), ((1, 0, (0, 1)),))
    assert (g1.start, g1.m, g1.target_heads) == (1, 0, ((0, 1, (2, 3)), (1, 1, (2,))))
    assert cfg.group_of(2) == [0, 1]
    assert [g.m for g in p.to_sparse_config(256).layer_groups] == [40, 0]  # calibrated at that budget
    assert [g.m for g in p.to_sparse_config(1024).layer_groups] == [cfg.with_budget(1024).layer_groups[0].m, 0]
    path = p.save(tmp_path / "g.json")
    assert load_profile(path) == p


def test_schema_1_loads_unchanged(tmp_path):
    d = profile().to_dict()
    for k in ("groups", "draft_group", "heldout"):
        d.pop(k)
    (tmp_path / "v1.json").write_text(json.dumps({**d, "schema_version": 1}))
    p = load_profile(tmp_path / "v1.json")
    assert p.schema_version == 1 and p.groups == () and p.to_sparse_config() == profile().to_sparse_config()


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["groups"][1].update(start=0), "must be two or more contiguous ranges"),
    (lambda d: d["groups"][1].update(stop=3), "must be two or more contiguous ranges"),
    (lambda d: d["groups"].pop(), "must be two or more contiguous ranges"),
    (lambda d: d["groups"][0].update(m=500), "group 0: m = 500 is outside"),
    (lambda d: d["groups"][1]["target_heads"].append({"layer": 2, "kv_head": 0, "query_heads": [0]}),
     "outside the model's 2 layers"),
    (lambda d: d.update(draft_group=2), "draft_group 2 is not one of"),
    (lambda d: d["groups"][0].pop("arr"), "group 0: missing field(s) arr"),
    (lambda d: d.update(schema_version=4), "reads 1, 2, 3, 5, 6, 7"),
])
def test_bad_layer_groups_refused(tmp_path, change, needle):
    d = json.loads(grouped().to_json())
    change(d)
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(DustinError) as e:
        load_profile(tmp_path / "p.json")
    assert needle in str(e.value) and "\n" not in str(e.value)
