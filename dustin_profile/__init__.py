"""Offline profiling: calibration windows, recorded ground truth, ARR, Algorithm 1,
baselines and the versioned profile artifact.

- `run.run_profile(ProfileConfig)`: the whole `dustin profile` run (resumable); returns the `Profile`.
- `artifact`: `Profile`, `load_profile`, `check_models`, `model_info` (what the runtime loads).
- `calibration`: documents from text/JSONL/parquet, seeded windows, verification positions.
- `groundtruth.record_window`: one window's true verification attention and candidate signals.
- `calib_arr`: `CalibStats`, ARR of the runtime's selection (`arr_grid`, `arr_exact`).
- `search.greedy_search`: Algorithm 1; `baselines`: streamingllm, draft-only, target-only, quest, oracle.
- `tables`, `plots`, `show`: parquet tables, PNG plots, rich / markdown rendering.
"""
