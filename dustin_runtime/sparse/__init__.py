"""The method: sparse verification over a selected subset of the KV cache.

- `config`: the `SparseConfig` (budget, sinks, window, m, retrieval heads, refresh layers);
- `policies`: the verification policies behind the loop's `SpecHooks` (full, dustin, the baselines);
- `signals`: the retrieval heads' online importance (draft lookahead, target history);
- `selection`: the sets of the baselines (streamingllm, Quest pages);
- `recovery`, `measures`, `teacher_forced`: ARR and the side measurements of a run.
"""
