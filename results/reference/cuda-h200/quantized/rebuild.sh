#!/bin/sh
# Rebuilds stats/quantized_peer.csv from raw/ (llama.cpp's own speculative decoding on CUDA):
# the quantized study's peer table, with no decodelab rows beside it (see README.md).
set -eu
cd "$(dirname "$0")"
python3 - <<'PY'
import glob

import pandas as pd

from decodelab import stats
from decodelab.config import Confidence
from decodelab.quantized_stats import peer_table

runs = stats.read_raw_runs(sorted(glob.glob("raw/llama.cpp-peer/*/rep*.parquet")), "llama_peer")
none = pd.DataFrame(columns=["pair", "mode", "k", "speedup", "proposal_acceptance"])
table = peer_table(runs, none, none, Confidence(0.95, 2000, 7))
table.to_csv("stats/quantized_peer.csv", index=False)
print(table.drop(columns=["decodelab_speedup", "decodelab_proposal_acceptance"]).round(3)
      .to_string(index=False))
PY
