# pileprep: `make shard` and `make test` work on a fresh clone; every target sets itself up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
SAMPLE_DIR := out/sample-corpus
SAMPLE_TOKENIZER := out/tokenizer/sample-8k.model
TOKENIZER ?= $(SAMPLE_TOKENIZER)
SEQ_LEN ?= 2048
# torch's OpenMP threads spin and slow TF/Beam in the same process; passive waits cost nothing here.
export OMP_WAIT_POLICY := PASSIVE

.PHONY: help setup setup-test test-deps shard test test-fast bench bench-dry-run bench-megatron bench-profile train clean flex-template worker-image env airflow retrieval retrieval-bench retrieval-scale-bench \
  spark flink engines spark-cluster flink-cluster spark-cluster-stop flink-cluster-stop bench-engines

# `make help` lists targets with a `## text` after their prerequisites, and these:
##@ shard: tokenize, pack and shard the embedded sample corpus into out/sample (TOKENIZER=, SEQ_LEN=)
##@ train: the bundled trainer on out/sample (DP=, PP=, STEPS=, RESUME=1; see trainer/README.md)
help: ## list the targets
	@awk '/^##@ / {sub(/^##@ /, ""); n = index($$0, ":"); printf "  make %-14s %s\n", substr($$0, 1, n - 1), substr($$0, n + 2); next} \
	  /^[a-zA-Z_-]+:.*## / {n = index($$0, ":"); printf "  make %-14s %s\n", substr($$0, 1, n - 1), substr($$0, index($$0, "## ") + 3)}' $(MAKEFILE_LIST)

# Two install levels (pyproject.toml holds every pin): `make setup` is what `make shard` needs (the pipeline, S3
# and the report's plots; no torch, no TensorFlow, no Java); `make setup-test` adds every test extra (torch from
# PyPI is a several-GB CUDA build that runs on the CPU, TensorFlow, Dask, the format readers, pytest).
setup: $(STAMP) ## create .venv with what `make shard` needs (no torch, no Java)
$(STAMP): pyproject.toml setup.py model_contract/_varint.c transforms/shard/_shingles.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[shard]'
	touch $(STAMP)

setup-test: $(TEST_STAMP) ## setup + every test extra (torch, TensorFlow, Dask, retrieval, pytest)
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[all]'
	touch $(TEST_STAMP)

$(SAMPLE_DIR)/.done: | $(STAMP)
	$(BIN)/pileprep sample --output $(SAMPLE_DIR)
	touch $@

$(SAMPLE_TOKENIZER): $(SAMPLE_DIR)/.done
	$(BIN)/pileprep tokenizer train --input '$(SAMPLE_DIR)/train/*.jsonl.zst' --output $@ --vocab-size 8000 --overwrite

shard: $(STAMP) $(SAMPLE_DIR)/.done $(TOKENIZER)
	$(BIN)/pileprep shard --input '$(SAMPLE_DIR)/train/*.jsonl.zst' --val-input '$(SAMPLE_DIR)/val.jsonl.zst' \
	  --test-input '$(SAMPLE_DIR)/test.jsonl.zst' --output out/sample --tokenizer $(TOKENIZER) \
	  --seq-len $(SEQ_LEN) --num-shards 4
	$(BIN)/pileprep inspect out/sample --examples 1
	$(BIN)/pileprep verify out/sample --inputs '$(SAMPLE_DIR)/train/*.jsonl.zst' '$(SAMPLE_DIR)/val.jsonl.zst' \
	  '$(SAMPLE_DIR)/test.jsonl.zst' --sample 200
	$(BIN)/pileprep report out/sample

# Real Airflow for the DAG test, in its own venv: its pins do not co-install with Beam's.
AIRFLOW_VERSION ?= 3.3.2
airflow: .venv-airflow/.installed ## real Airflow in .venv-airflow (tests/e2e/test_airflow.py)
.venv-airflow/.installed:
	test -x .venv-airflow/bin/python || $(PY) -m venv .venv-airflow
	.venv-airflow/bin/pip install -q "apache-airflow==$(AIRFLOW_VERSION)"
	touch $@

# ---- Spark and Flink (docs/OPERATIONS.md): Beam's job servers by Maven coordinates and the engines from PyPI,
# fetched once into a cache outside the repository (${XDG_CACHE_HOME:-~/.cache}/pileprep/engines; the pins are
# pyproject.toml's [tool.pileprep.engines]; pipeline/ops/engines/fetch.py). Only these targets need Java 17 + Maven:
# `make setup` and `make shard` never do. The clusters run in the background until their -stop target.
ENGINES := $(BIN)/python -m pipeline.ops.engines
ENGINES_STATE ?= out/engines
spark: $(STAMP) ## Beam's Spark job server (mvn) + Spark (pyspark) into the engines cache (Java 17, Maven; pins: pyproject.toml)
	@$(ENGINES).fetch spark
flink: $(STAMP) ## Beam's Flink job server (mvn) + Flink (apache-flink-libraries) into the engines cache
	@$(ENGINES).fetch flink
engines: spark flink ## make spark + make flink

spark-cluster: spark ## a Spark standalone master + 2 workers on 127.0.0.1; prints MASTER_URL= and BEAM_ARGS=
	@$(ENGINES).cluster start spark --state-dir $(ENGINES_STATE)/spark
spark-cluster-stop: ## stop what `make spark-cluster` started
	@$(ENGINES).cluster stop --state-dir $(ENGINES_STATE)/spark
flink-cluster: flink ## a Flink JobManager + TaskManager on 127.0.0.1; prints MASTER_URL= and BEAM_ARGS=
	@$(ENGINES).cluster start flink --state-dir $(ENGINES_STATE)/flink
flink-cluster-stop: ## stop what `make flink-cluster` started
	@$(ENGINES).cluster stop --state-dir $(ENGINES_STATE)/flink

# What the end-to-end tests use beyond the venv, brought by `make test` itself (idempotent, cached): real Airflow
# in its own venv (tests/e2e/test_airflow.py) and, as root with apt, Debian's headless Chromium
# (tests/e2e/test_report.py). Either failing to install is said in one line; those tests then say why they skip.
# The JVM engines (tests/e2e/test_engines_spark.py, test_engines_flink.py) must install: those tests fail, never
# skip, where they cannot run (CI has Java 17 and Maven).
# MosaicML Streaming (the MDS reader of tests/e2e/test_export_formats.py) pins numpy<2.2 and transformers<5; it
# runs with this venv's, so it and the modules it imports that nothing else brings are installed without deps.
STREAMING = mosaicml-streaming==0.13.0 brotli==1.2.1 python-snappy==0.7.3 cramjam==2.14.0 zstd==1.5.7.2 \
  catalogue==2.0.10
test-deps: $(TEST_STAMP) engines
	@$(BIN)/python -c 'import streaming' 2>/dev/null || $(BIN)/pip install -q --no-deps $(STREAMING)
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } || \
	  echo 'WARNING: chromium could not be installed; the report browser test will say so'
	@$(MAKE) -s airflow || echo 'WARNING: Airflow could not be installed; tests/e2e/test_airflow.py will say so'

test: test-deps ## the whole suite: tests/unit, tests/integration, tests/e2e (what CI runs); sets itself up first
	$(BIN)/python -m pytest -q --durations=40 --skip-guard tests

test-fast: $(TEST_STAMP) ## the unit tests only (tests/unit/<room>/, marker unit), a few minutes
	$(BIN)/python -m pytest -q tests/unit -m unit

# The Llama 2 model from ../shared/data when present (else the sample one); TOKENIZER=, BENCH_ARGS=--quick to override.
BENCH_SCRIPT ?= bench/shard_bench.py
bench: $(TEST_STAMP) ## shard throughput and peak RSS at 24/96/384 MB vs raw SentencePiece, per backend (~15-20 min)
ifeq ($(origin TOKENIZER),file)
	test -f ../shared/data/tokenizers/llama2-bpe-32k.model || $(MAKE) $(SAMPLE_TOKENIZER)
	$(BIN)/python $(BENCH_SCRIPT) $(BENCH_ARGS)
else
	$(BIN)/python $(BENCH_SCRIPT) --tokenizer $(TOKENIZER) $(BENCH_ARGS)
endif

# The same corpora and tokenizer choice as `make bench`; BENCH_ARGS='--sizes 96' for the smaller one alone.
bench-engines: $(TEST_STAMP) engines ## FnApiRunner, Dask, Spark, Flink alternating on ENGINES_INPUT='glob' (TOKENIZER=; docs/BENCHMARKS.md, issue 31)
	test -n "$(ENGINES_INPUT)" || { echo "set ENGINES_INPUT to the corpus files (e.g. a pileprep sample --size-mb 96)"; exit 2; }
	$(BIN)/python bench/engines_bench.py --input $(ENGINES_INPUT) --tokenizer $(TOKENIZER) --repeat 2

bench-dry-run: $(TEST_STAMP) ## `pileprep shard --dry-run` vs the real run at 96/384 MB: core-s and output bytes (~5 min)
	$(MAKE) bench BENCH_SCRIPT=bench/dry_run_bench.py

# MEGATRON_DIR=<a Megatron-LM checkout, e.g. tag core_v0.16.1>: its preprocess_data.py beside pileprep shard.
bench-megatron: $(TEST_STAMP) ## Megatron-LM's preprocess_data.py vs pileprep shard, same documents, 96/384 MB
	test -n "$(MEGATRON_DIR)" || { echo "set MEGATRON_DIR to a Megatron-LM checkout"; exit 2; }
	$(BIN)/python bench/megatron_side_by_side.py --megatron-dir "$(MEGATRON_DIR)" $(BENCH_ARGS)

# PROFILE_INPUT= a glob of .jsonl.zst (default: the sample corpus); a fresh output per run (a rerun would be a no-op).
PROFILE_INPUT ?= $(SAMPLE_DIR)/train/*.jsonl.zst
bench-profile: $(TEST_STAMP) $(SAMPLE_DIR)/.done $(TOKENIZER) ## busy cores per stage, idle core-s, the 1 MB fixed cost, JSON parse cost
	rm -rf out/bench/profile out/bench/profile-1mb
	$(BIN)/python bench/profile_shard.py --input '$(PROFILE_INPUT)' --tokenizer $(TOKENIZER) --output out/bench/profile \
	  --seq-len $(SEQ_LEN)
	$(BIN)/python bench/profile_shard.py --one-mb --input '$(PROFILE_INPUT)' --tokenizer $(TOKENIZER) \
	  --output out/bench/profile-1mb --seq-len $(SEQ_LEN)
	$(BIN)/python bench/json_parse_bench.py --inputs '$(PROFILE_INPUT)'

clean: ## remove out/
	rm -rf out

env: $(STAMP) ## print versions and whether the C extensions (varint codec, word shingles) are active
	$(BIN)/pileprep env

flex-template: $(STAMP) ## regenerate the Dataflow Flex Template's metadata.json from the config
	$(BIN)/python -m pipeline.options > pipeline/ops/schedule/flex_template/metadata.json

WORKER_IMAGE ?= pileprep-worker:$(shell $(PY) -c "import re;print(re.search(r'PILEPREP_VERSION = \"(.*)\"', open('pipeline/config.py').read())[1])")
worker-image: ## build the Beam worker container (Dockerfile) as pileprep-worker:VERSION
	docker build -t $(WORKER_IMAGE) .

# ---- trainer: the tiny GPT on `make shard`'s output, real torchrun processes on CPU (gloo).
# `make train` = PP=2 (2 processes); `make train DP=2` = DP=2 x PP=2 (4 processes). RESUME=1 continues the
# last run from out/train/ckpt; without it a TRAIN_DIR that already holds a run is refused, never deleted.
DP ?= 1
PP ?= 2
NPROC ?= $(shell expr $(DP) \* $(PP))
STEPS ?= 40
MICROBATCHES ?=
TRAIN_DIR ?= out/train
TRAIN_ARGS ?=
train: $(TEST_STAMP)
	@if [ -z "$(RESUME)" ] && [ -n "$$(ls -A $(TRAIN_DIR) 2>/dev/null)" ]; then \
	  echo "error: $(TRAIN_DIR) already holds a training run (make train never deletes one): continue it with" \
	    "'make train RESUME=1 TRAIN_DIR=$(TRAIN_DIR)', or start fresh in a new directory with 'make train TRAIN_DIR=$(TRAIN_DIR)-2'" >&2; \
	  exit 2; fi
	test -f out/sample/manifest.json || $(MAKE) shard
	mkdir -p $(TRAIN_DIR)
	$(BIN)/torchrun --standalone --nproc-per-node $(NPROC) -m trainer.train --data out/sample --model tiny \
	  --dp $(DP) --pp $(PP) $(if $(MICROBATCHES),--microbatches $(MICROBATCHES)) --global-batch 8 \
	  --steps $(STEPS) --log-every 5 --threads 1 --checkpoint-dir $(TRAIN_DIR)/ckpt --checkpoint-every 20 \
	  --metrics-file $(TRAIN_DIR)/metrics.jsonl $(TRAIN_ARGS)

# ---- retrieval (docs/RETRIEVAL.md): chunk database, index and neighbours for `make shard`'s output.
# RETRIEVAL_ENCODER=bm25 (default: the whole sample, no model) or minilm (all-MiniLM-L6-v2 on CPU over a capped
# subset: RETRIEVAL_DOC_FRACTION of the documents). Neighbours go to a sidecar beside the dataset.
RETRIEVAL_ENCODER ?= bm25
RETRIEVAL_DOC_FRACTION ?= $(if $(filter minilm,$(RETRIEVAL_ENCODER)),0.05,1.0)
RETRIEVAL_ARGS ?=
retrieval: $(TEST_STAMP) ## chunk database, index and neighbours for out/sample (RETRIEVAL_ENCODER=bm25|minilm)
	test -f out/sample/manifest.json || $(MAKE) shard
	$(BIN)/pileprep retrieval build --dataset out/sample --output out/retrieval/db-$(RETRIEVAL_ENCODER) \
	  --encoder $(RETRIEVAL_ENCODER) --doc-fraction $(RETRIEVAL_DOC_FRACTION) $(RETRIEVAL_ARGS)
	$(BIN)/pileprep retrieval neighbours --dataset out/sample --db out/retrieval/db-$(RETRIEVAL_ENCODER) \
	  --output out/retrieval/neighbours-$(RETRIEVAL_ENCODER)
	$(BIN)/pileprep retrieval show --dataset out/sample --db out/retrieval/db-$(RETRIEVAL_ENCODER) \
	  --neighbours out/retrieval/neighbours-$(RETRIEVAL_ENCODER)

retrieval-bench: $(TEST_STAMP) ## MiniLM encode rate, index build/bytes, queries/s, recall@2 vs exact
	test -f out/sample/manifest.json || $(MAKE) shard
	$(BIN)/python bench/retrieval_bench.py --dataset out/sample

# Index kinds on >= 100k real MiniLM vectors of the sample corpus's 64-token chunks (encoded once, cached in
# out/bench/; CPU-hours on 2 shared cores), and the sharded search's peak RSS at 1x/4x the database.
RETRIEVAL_CORPUS ?= out/sample-corpus/train/*.jsonl.zst
RETRIEVAL_BENCH_TOKENIZER ?= ../shared/data/tokenizers/llama2-bpe-32k.model
retrieval-scale-bench: $(TEST_STAMP) $(SAMPLE_DIR)/.done ## recall@2 / bytes per vector per index kind on cached MiniLM vectors; memory 1x/4x
	nice -n 10 $(BIN)/python bench/retrieval_corpus.py --input '$(RETRIEVAL_CORPUS)' \
	  --tokenizer $(RETRIEVAL_BENCH_TOKENIZER) --chunks 120000
	$(BIN)/python bench/retrieval_bench.py --vectors $$(ls -t out/bench/minilm-*.npz | head -1) --chunks 120000
	nice -n 10 $(BIN)/python bench/retrieval_memory_bench.py
