"""LongBench samples from a folder of <dataset>.jsonl files or from the local Hugging Face datasets
cache (a tiny cache written by `datasets` itself, in the Hub's layout, read offline)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from dustin_eval.longbench_data import FIELDS, available_datasets, iter_records, load_dataset
from dustin_runtime.errors import DustinError


def sample(dataset, i, classes=None):
    return {"input": f"q{i}", "context": f"context {i} " * 3, "answers": [f"a{i}", f"b{i}"], "length": 10 + i,
            "dataset": dataset, "language": "en", "all_classes": classes, "_id": f"{dataset}-{i}"}


ROWS = {"multi_news": [sample("multi_news", i) for i in range(4)],
        "trec": [sample("trec", i, ["Entity", "Location"]) for i in range(3)]}


@pytest.fixture
def jsonl_dir(tmp_path):
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for name, rows in ROWS.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def hub_cache(root: Path, repo_id: str, configs: dict) -> Path:
    """A datasets cache holding `repo_id`'s configurations (test split) as `datasets` writes a Hub
    dataset: <cache>/<namespace>___<snake_name>/<config>/<version>/<hash>/ with its arrow file."""
    pytest.importorskip("datasets")
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.json.json import Json

    ns, name = repo_id.split("/")
    cache = root / "hf-datasets"
    for config, rows in configs.items():
        src = root / "src" / f"{config}.jsonl"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        builder = Json(cache_dir=str(root / "build"), dataset_name=name, config_name=config,
                       data_files={"test": str(src)}, hash="0123456789abcdef")
        builder.download_and_prepare()
        built = Path(builder.cache_dir)
        dest = cache / f"{ns}___{camelcase_to_snakecase(name)}" / config / built.parent.name / built.name
        dest.parent.mkdir(parents=True)
        shutil.move(str(built), str(dest))
    return cache


def test_jsonl_folder(jsonl_dir):
    assert available_datasets(jsonl_dir) == ["multi_news", "trec"]
    assert list(iter_records(jsonl_dir, "trec")) == ROWS["trec"]
    assert load_dataset(jsonl_dir, "multi_news", limit=2) == ROWS["multi_news"][:2]
    with pytest.raises(DustinError, match="qasper.jsonl not found"):
        load_dataset(jsonl_dir, "qasper")
    with pytest.raises(DustinError, match="unknown LongBench dataset 'nope'"):
        load_dataset(jsonl_dir, "nope")
    with pytest.raises(DustinError, match="limit must be >= 1"):
        load_dataset(jsonl_dir, "trec", limit=0)
    (jsonl_dir / "trec.jsonl").write_text(json.dumps({k: v for k, v in ROWS["trec"][0].items() if k != "answers"}))
    with pytest.raises(DustinError, match="trec sample 1: missing field"):
        load_dataset(jsonl_dir, "trec")


def test_not_a_source(tmp_path):
    with pytest.raises(DustinError, match="no such folder"):
        available_datasets(tmp_path / "missing" / "folder")


def test_datasets_cache_folder_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    cache = hub_cache(tmp_path, "THUDM/LongBench", ROWS)
    assert available_datasets(cache) == ["multi_news", "trec"]
    for name, rows in ROWS.items():
        got = load_dataset(cache, name)
        assert got == rows and all(set(FIELDS) <= set(r) for r in got)
    assert load_dataset(cache, "trec", limit=1) == ROWS["trec"][:1]
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"
    with pytest.raises(DustinError, match=r"qasper of THUDM/LongBench .* not found \(cached: multi_news, trec\)"):
        load_dataset(cache, "qasper")


def test_dataset_id_in_the_default_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    cache = hub_cache(tmp_path, "zai-org/LongBench", {"trec": ROWS["trec"]})
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    assert available_datasets("zai-org/LongBench") == ["trec"]
    assert load_dataset("zai-org/LongBench", "trec") == ROWS["trec"]
    assert available_datasets("THUDM/LongBench") == []
    with pytest.raises(DustinError, match="trec of THUDM/LongBench .* not found"):
        load_dataset("THUDM/LongBench", "trec")
