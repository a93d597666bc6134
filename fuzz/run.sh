#!/usr/bin/env bash
# Runs fuzz targets one after another, each until 10 million executions or 30 minutes
# (whichever comes first), one in-process libFuzzer worker at a time (no -jobs: that
# would fork a child logging to ./fuzz-N.log), niced. Usage:
#   fuzz/run.sh [TARGET...]          (default: all)
#   RUNS=100000 SECS=60 fuzz/run.sh socks_server
# Needs the targets built: cd fuzz && cargo +nightly fuzz build
# Working corpora grow in fuzz/work/corpus/TARGET (seeded from fuzz/seeds/TARGET and
# the committed fuzz/corpus/TARGET), logs go to fuzz/work/logs, crashes to
# fuzz/work/artifacts/TARGET/.
set -uo pipefail
cd "$(dirname "$0")"
RUNS=${RUNS:-10000000}
SECS=${SECS:-1800}
BIN=target/x86_64-unknown-linux-gnu/release
ALL="socks_server socks_client beacon greeting channel_frame image_decode control_request config_mh config_msrd wire_views"
max_len() {
  case $1 in
    socks_*) echo 1024 ;;      # messages are at most 262 bytes
    beacon|control_request) echo 4096 ;;
    greeting) echo 5000 ;;     # datagrams above 4096 bytes are refused
    wire_views) echo 2048 ;;   # headers end within 120 bytes; the rest is payload
    *) echo 16384 ;;           # frames, images, config files
  esac
}
mkdir -p work/logs
for t in ${@:-$ALL}; do
  mkdir -p "work/corpus/$t" "work/artifacts/$t" corpus/$t
  echo "== $t: up to $RUNS runs or $SECS s" >&2
  start=$(date +%s)
  nice -n 15 "$BIN/$t" "work/corpus/$t" "seeds/$t" "corpus/$t" \
    -runs="$RUNS" -max_total_time="$SECS" -max_len="$(max_len "$t")" \
    -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="work/artifacts/$t/" >"work/logs/$t.log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "work/logs/$t.log" | grep -o '[0-9]*$')
  echo "$t rc=$rc execs=${execs:-?} secs=$((end - start))" | tee -a work/logs/summary.txt >&2
done
