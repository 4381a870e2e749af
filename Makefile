# pileprep: `make shard` and `make test` work on a fresh clone; every target sets itself up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SAMPLE_DIR := out/sample-corpus
SAMPLE_TOKENIZER := out/tokenizer/sample-8k.model
TOKENIZER ?= $(SAMPLE_TOKENIZER)
SEQ_LEN ?= 2048
# torch's OpenMP threads spin and slow TF/Beam in the same process; passive waits cost nothing here.
export OMP_WAIT_POLICY := PASSIVE

.PHONY: setup shard test bench train clean

setup: $(STAMP)
$(STAMP): setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[all]'
	touch $(STAMP)

$(SAMPLE_DIR)/.done: | $(STAMP)
	$(BIN)/pileprep sample --output $(SAMPLE_DIR)
	touch $@

$(SAMPLE_TOKENIZER): $(SAMPLE_DIR)/.done
	$(BIN)/pileprep tokenizer train --input '$(SAMPLE_DIR)/train/*.jsonl.zst' --output $@ --vocab-size 8000

shard: $(STAMP) $(SAMPLE_DIR)/.done $(TOKENIZER)
	$(BIN)/pileprep shard --input '$(SAMPLE_DIR)/train/*.jsonl.zst' '$(SAMPLE_DIR)/val.jsonl.zst' \
	  '$(SAMPLE_DIR)/test.jsonl.zst' --output out/sample --tokenizer $(TOKENIZER) --seq-len $(SEQ_LEN) \
	  --num-shards 4
	$(BIN)/pileprep inspect out/sample --examples 1

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP) $(SAMPLE_DIR)/.done $(TOKENIZER)
	$(BIN)/python bench/shard_bench.py --input '$(SAMPLE_DIR)/train/*.jsonl.zst' --tokenizer $(TOKENIZER)

clean:
	rm -rf out
