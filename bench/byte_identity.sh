#!/usr/bin/env bash
# Issue 29's same-bytes rule: one fixed sequence of pileprep commands on a fixed small corpus, every output kept,
# so that two checkouts (before/after a refactor) can be compared file by file with cmp.
#
#   bench/byte_identity.sh run OUT_DIR [CHECKOUT]    run the sequence with CHECKOUT's code (default: the checkout
#                                                    this script lives in) into OUT_DIR (must be empty or absent)
#   bench/byte_identity.sh compare DIR_A DIR_B       cmp every file of two runs; exit 1 on any difference
#
# CHECKOUT's code runs with PYTHONPATH=CHECKOUT and CHECKOUT/.venv/bin/python (or python3). Every command runs
# with OUT_DIR as its working directory and relative paths, so manifests (which record input paths as given)
# do not name OUT_DIR; the corpus files get a fixed mtime because the input ledger records each file's mtime.
# Every shard run passes an explicit runner (README: pileprep never relies on Beam's default one).
#
# What is compared: everything under OUT_DIR except _meta/. _meta/ holds what is legitimately not the same
# from run to run, each with its reason in _meta/EXCLUDED (compare prints that list): the raw stdout of the
# shard runs (rates per second and wall time; a filtered copy without exactly those two is compared), the
# killed run's output and the resumed run's stdout (what was reused depends on when the kill landed; the
# resumed dataset itself is compared), the exports' refs (clock time, absolute path; a normalised copy is
# compared), and the checkout's commit. Takes ~3-4 minutes on a loaded 2-core machine (load average 5-7).
set -euo pipefail
export LC_ALL=C  # one sort order for comm and find | sort

usage() { sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

compare() {  # compare DIR_A DIR_B: every file present in both, same bytes
  local a=$1 b=$2 f n=0 diffs=0
  [[ -d $a && -d $b ]] || { echo "compare: $a or $b is not a directory" >&2; exit 2; }
  local list_a list_b
  list_a=$(cd "$a" && find . -type f -not -path './_meta/*' | sort)
  list_b=$(cd "$b" && find . -type f -not -path './_meta/*' | sort)
  while read -r f; do [[ -n $f ]] && { echo "only in $a: $f"; diffs=$((diffs + 1)); }
  done < <(comm -23 <(echo "$list_a") <(echo "$list_b"))
  while read -r f; do [[ -n $f ]] && { echo "only in $b: $f"; diffs=$((diffs + 1)); }
  done < <(comm -13 <(echo "$list_a") <(echo "$list_b"))
  while read -r f; do
    [[ -z $f ]] && continue
    n=$((n + 1))
    cmp -s "$a/$f" "$b/$f" || { echo "DIFFERS: $f"; diffs=$((diffs + 1)); }
  done < <(comm -12 <(echo "$list_a") <(echo "$list_b"))
  echo "commits: $(cat "$a/_meta/commit" 2>/dev/null || echo '?') vs $(cat "$b/_meta/commit" 2>/dev/null || echo '?')"
  echo "not compared (from $a/_meta/EXCLUDED):"
  sed 's/^/  /' "$a/_meta/EXCLUDED" 2>/dev/null || echo "  (none listed)"
  echo "$n files in both compared with cmp; $diffs difference(s)"
  [[ $diffs -eq 0 ]] || exit 1
}

[[ $# -ge 1 ]] || usage
case $1 in
  compare) [[ $# -eq 3 ]] || usage; compare "$2" "$3"; exit 0 ;;
  run) [[ $# -ge 2 && $# -le 3 ]] || usage ;;
  *) usage ;;
esac

OUT=$2
CHECKOUT=$(cd "${3:-$(dirname "$0")/..}" && pwd)
if [[ -e $OUT && -n $(ls -A "$OUT") ]]; then echo "run: $OUT is not empty" >&2; exit 2; fi
mkdir -p "$OUT/_meta" "$OUT/logs"
cd "$OUT"
PY=$CHECKOUT/.venv/bin/python; [[ -x $PY ]] || PY=python3
export PYTHONPATH=$CHECKOUT OMP_WAIT_POLICY=PASSIVE
# The code that runs must be CHECKOUT's, not an installed copy.
[[ $($PY -c 'import os, pipeline; print(os.path.dirname(os.path.dirname(os.path.abspath(pipeline.__file__))))') \
   == "$CHECKOUT" ]] \
  || { echo "run: pipeline does not import from $CHECKOUT" >&2; exit 2; }
{ git -C "$CHECKOUT" rev-parse --short HEAD; git -C "$CHECKOUT" status --short --untracked-files=no; } > _meta/commit
pp() { "$PY" -m pipeline.cli "$@"; }
note() { echo "$1: $2" >> _meta/EXCLUDED; }
step() { echo "[$(date +%T)] $*" >&2; }

# Shard's stdout ends its counter table with a "per second" column and a "wall time" row: the raw stdout goes
# to _meta/, the compared copy keeps every counter's total and drops exactly those two.
# (The header's and the dashes' widths follow the rates' column, so the table's header is rewritten too.)
strip_rates() {
  awk '/^counter +total +per second/ {t = 1; print "counter total"; next} t && /^-+$/ {next}
       t && /^wall time/ {t = 0; next} t && NF == 3 {print $1, $2; next} {print}'
}
shard() {  # shard NAME ARGS...: logs/NAME.stdout (rates stripped), _meta/NAME.stdout (raw)
  local name=$1; shift
  pp shard "$@" > "_meta/$name.stdout"
  strip_rates < "_meta/$name.stdout" > "logs/$name.stdout"
}
note "_meta/*.stdout" "shard's raw stdout: docs/s, tokens/s, ... per second and the wall time;\
 tokenizer train's: seconds, read_seconds (logs/ holds each without them)"
note "_meta/commit" "the checkout's commit (printed above)"

# --- the corpus: the embedded sample (8 train files, val, test), plus duplicates and near-duplicates ---------
step "sample + tokenizer"
pp sample --output corpus --size-mb 2 > logs/sample.stdout
# extra/dups.jsonl: two exact copies and two near copies (one line appended: word 5-gram Jaccard ~0.98) of train
# documents, and a near copy of a val document (held-out copies win: the train one goes). extra/eval.jsonl: an
# "evaluation set" (field "question") quoting 40 words of a train document and 30 of a test one.
"$PY" - <<'EOF'
import json, os, zstandard
def docs(path):
    with open(path, "rb") as f:
        text = zstandard.ZstdDecompressor().stream_reader(f).read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
train = [d for d in docs("corpus/train/00.jsonl.zst") if 300 <= len(d["text"].split()) <= 3000][:4]
val = [d for d in docs("corpus/val.jsonl.zst") if len(d["text"].split()) >= 150][:1]
assert len(train) == 4 and len(val) == 1, (len(train), len(val))
out = [train[0], train[1]] + [dict(d, text=d["text"] + "\n(mirrored copy)\n") for d in train[2:] + val]
os.makedirs("corpus/extra")
with open("corpus/extra/dups.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(d, sort_keys=True) + "\n" for d in out)
quote = [d for d in docs("corpus/train/01.jsonl.zst") if len(d["text"].split()) > 200][0]["text"].split()[100:140]
held_out = docs("corpus/test.jsonl.zst")[1]["text"].split()[50:80]
with open("corpus/extra/eval.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"question": " ".join(q)}) + "\n" for q in (quote, held_out))
EOF
find corpus -type f -exec touch -d '2026-01-01 00:00:00 UTC' {} +
# Its stdout's "seconds" and "read_seconds" are wall times: the raw one goes to _meta/, a copy without them is compared.
pp tokenizer train --input 'corpus/train/*.jsonl.zst' --output tok/sample-2k.model --vocab-size 2000 \
  > _meta/tokenizer-train.stdout
"$PY" -c 'import json, sys; d = json.load(sys.stdin); d.pop("seconds"); d.pop("read_seconds")
json.dump(d, sys.stdout, indent=1, sort_keys=True)' < _meta/tokenizer-train.stdout > logs/tokenizer-train.stdout

# --- shard runs ------------------------------------------------------------------------------------------------
RUNNER=(--runner=FnApiRunner --direct_num_workers=2 --direct_running_mode=multi_threading)
COMMON=(--tokenizer tok/sample-2k.model --seq-len 256 --num-shards 2 --unit-mb 0.25
        --val-input corpus/val.jsonl.zst --test-input corpus/test.jsonl.zst "${RUNNER[@]}")
TRAIN=('corpus/train/*.jsonl.zst' corpus/extra/dups.jsonl)
step "shard: plain, near-dedup"
shard plain --input "${TRAIN[@]}" --output ds/plain "${COMMON[@]}"
shard near-dedup --input "${TRAIN[@]}" --output ds/near-dedup --near-dedup "${COMMON[@]}"
grep -q '"near_duplicate"' ds/near-dedup/manifest.json || { echo "run: near-dedup removed nothing" >&2; exit 1; }
# The other code paths in one run: token shingles with exact verification, decontamination (held-out too),
# best-fit packing, the runner's GroupByKey as the shuffle.
step "shard: variants (token shingles, --near-dedup-verify, --decontaminate, best-fit, --shuffle runner)"
shard variants --input "${TRAIN[@]}" --output ds/variants --near-dedup --near-dedup-shingles tokens \
  --near-dedup-verify --decontaminate corpus/extra/eval.jsonl --decontaminate-field question \
  --decontaminate-held-out --packing best-fit --shuffle runner "${COMMON[@]}"
grep -q '"contaminated"' ds/variants/manifest.json || { echo "run: decontamination removed nothing" >&2; exit 1; }

step "shard: incremental (plain, near-dedup): 6 train files, then all and the duplicates"
for v in plain near-dedup; do
  flags=(); [[ $v == near-dedup ]] && flags=(--near-dedup)
  shard "incremental-$v-1" --input 'corpus/train/0[0-5].jsonl.zst' --output "ds/incremental-$v" "${flags[@]}" \
    "${COMMON[@]}"
  shard "incremental-$v-2" --input "${TRAIN[@]}" --output "ds/incremental-$v" --incremental "${flags[@]}" "${COMMON[@]}"
done

# Resume: the plain run again, killed (-9, its whole process group) once the first unit's completion marker is
# in staging, then run again. The marker's name may change in a refactor (it is internal): any staged .json
# whose path names a unit counts (UNIT_MARKER_GLOB overrides). --break-lock: the killed run's lock is fresh.
step "shard: killed after the first unit marker, then resumed"
UNIT_MARKER_GLOB=${UNIT_MARKER_GLOB:-*unit*.json}
setsid "$PY" -m pipeline.cli shard --input "${TRAIN[@]}" --output ds/resumed "${COMMON[@]}" \
  > _meta/resumed-killed.stdout 2> _meta/resumed-killed.stderr &
pid=$!
until [[ -n $(find ds/resumed -type f -path "$UNIT_MARKER_GLOB" 2>/dev/null | head -1) ]]; do
  kill -0 "$pid" 2>/dev/null || { echo "run: the shard run to kill ended before a unit marker appeared" >&2; exit 1; }
  sleep 0.05
done
kill -9 -- "-$pid"; wait "$pid" || true
[[ ! -e ds/resumed/manifest.json ]] || { echo "run: the killed run had committed already" >&2; exit 1; }
pp shard --input "${TRAIN[@]}" --output ds/resumed --break-lock "${COMMON[@]}" > _meta/resumed.stdout
grep -E '^units_reused' _meta/resumed.stdout >&2 || true
# Exact resume: the resumed dataset is the uninterrupted one's, byte for byte (a check within this run).
(cd ds/resumed && find . -type f | sort | while read -r f; do cmp "$f" "../plain/$f" || true; done) \
  > _meta/resumed-vs-plain 2>&1
[[ ! -s _meta/resumed-vs-plain ]] || { cat _meta/resumed-vs-plain >&2; echo "run: resumed != plain" >&2; exit 1; }
note "_meta/resumed*" "the killed run's output, and the resumed run's stdout (units/shards reused depend on\
 when the kill landed)"

# --- what reads a dataset --------------------------------------------------------------------------------------
step "retrieval build + neighbours"
pp retrieval build --dataset ds/plain --output retrieval/db "${RUNNER[@]}" > logs/retrieval-build.stdout
pp retrieval neighbours --dataset ds/plain --db retrieval/db --output retrieval/neighbours "${RUNNER[@]}" \
  > logs/retrieval-neighbours.stdout
step "verify, inspect, report, export"
for ds in plain near-dedup; do
  pp verify "ds/$ds" --inputs "${TRAIN[@]}" corpus/val.jsonl.zst corpus/test.jsonl.zst --sample 60 \
    > "logs/verify-$ds.stdout"
  pp inspect "ds/$ds" --examples 2 > "logs/inspect-$ds.stdout"
  pp inspect "ds/$ds" --examples 2 --json > "logs/inspect-$ds.json"
  pp report "ds/$ds" --output "reports/$ds.html" > "logs/report-$ds.stdout"
done
pp verify ds/variants --inputs "${TRAIN[@]}" corpus/val.jsonl.zst corpus/test.jsonl.zst --sample 60 \
  > logs/verify-variants.stdout
for fmt in parquet megatron hf mds; do
  pp export ds/plain --format "$fmt" --output "exports/$fmt" > "logs/export-$fmt.stdout"
done
# Each export pins its generation with a ref in ds/plain/.refs/ (model_contract/refs.py): its "created" is a
# clock time and its "holder" the output's absolute path, whose sha256 names the file. The refs move to _meta/;
# logs/plain-refs.json keeps the rest of each (holder relative to OUT_DIR), sorted.
mv ds/plain/.refs _meta/plain-refs
"$PY" - "$PWD" <<'EOF'
import json, os, sys
refs = [json.load(open(os.path.join("_meta/plain-refs", n))) for n in os.listdir("_meta/plain-refs")]
for r in refs:
    del r["created"]
    r["holder"] = os.path.relpath(r["holder"], sys.argv[1])
with open("logs/plain-refs.json", "w") as f:
    json.dump(sorted(refs, key=lambda r: r["holder"]), f, indent=1, sort_keys=True)
EOF
note "_meta/plain-refs/" "the exports' refs: file name = sha256 of the absolute holder path, \"created\" =\
 clock time (logs/plain-refs.json holds the rest)"
step "done: $(find . -type f -not -path './_meta/*' | wc -l) files to compare in $OUT"
