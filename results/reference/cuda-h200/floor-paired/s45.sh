#!/usr/bin/env bash
# s45, call 1 (ran on an H200, call1/): gpt2-xl on `fused` against the floor (#18's target
# where the card is an H200) and, in the same process, on `fused-deterministic` (no reduction
# tuned per process: does that cost time, and do its greedy tokens stay with eager's?); then the
# attention tests and the cache and graph-engine tests with a verification's rows in one program
# per head as the default (attention.shares_rows).
# Its setup, inline when it ran, is setup.sh here now (the same lines).
set -uo pipefail
source results/reference/cuda-h200/floor-paired/setup.sh
floor fused,fused-deterministic fused 340
timeout 60 python3 -m pytest tests/test_attention.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_attention.txt 2>&1; echo "exit $?" >> $OUT/test_attention.txt
tail -4 $OUT/test_attention.txt
timeout ${TESTS_S:-150} python3 -m pytest tests/test_static_cache.py tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -k "static_cache or (fused and not refused)" --durations=5 -p no:logging > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
