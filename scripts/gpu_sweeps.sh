#!/usr/bin/env bash
# Stable GPU timings: graph-mode and eager sweeps on one CUDA card, in one device call without
# Snakemake: the GPT-2 family's cache-on sweep (init weights, float16, prompt 32) in REPS
# processes per model and engine, interleaved process by process: `graph` (static-cache CUDA
# graphs) and `eager` with cuDNN attention left out (sdp_backends flash, mem_efficient, math;
# see decodelab.backends.devices.set_sdp_backends), then the verdicts (cv between processes per
# configuration, `decodelab verdicts`) and the latency table. Writes $OUT/gpu-sweeps.tgz holding
# results/gpu-runs/<card>/stable-timing/ (raw/, stats/, logs/, commands.sh; cuda-h200 or cuda-h100
# by nvidia-smi's name, else the backend), or REF.
#   Usage: scripts/gpu_sweeps.sh [SECONDS (default 540)]
#   MODELS="gpt2 gpt2-xl" REPS=3 BACKEND=cuda ENGINES="graph eager"; engine `pinned` is `eager`
#   with every process on one CPU core (PIN, default 2), to test whether the eager spread between
#   processes follows the core that launches the kernels; its test on a CPU:
#   BACKEND=cpu ENGINES=eager MODELS=gpt2-tiny REPS=2 scripts/gpu_sweeps.sh 300
# A run lands in results/gpu-runs/ (raw rows, logs); what becomes a reference is its stats/ and a
# one-page README, copied into results/reference/<name>/ (results/reference/README.md).
set -uo pipefail
deadline=$((SECONDS + ${1:-540}))
models=${MODELS:-gpt2 gpt2-xl}
reps=${REPS:-3}
backend=${BACKEND:-cuda}
engines=${ENGINES:-graph eager}
pin=${PIN:-2}
out=${OUT:-/tmp/gpu-sweeps-out}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
case $card in *H200*) dev=cuda-h200 ;; *H100*) dev=cuda-h100 ;; *) dev=$backend ;; esac
ref=${REF:-results/gpu-runs/$dev/stable-timing} # the card's reference, unless REF names one
work=${WORK:-/tmp/gpu-sweeps}
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import jsonschema" 2>/dev/null && ls .gpu/whl/*.whl >/dev/null 2>&1; then
	python3 -m pip install -q --no-index --no-deps --target /tmp/site-schema .gpu/whl/*.whl
	export PYTHONPATH=/tmp/site-schema:$PYTHONPATH
fi
repo=$PWD
mkdir -p "$out" "$work/$ref/logs" && cd "$work" || exit 1
log=$ref/logs
left() { echo $((deadline - SECONDS)); }
say() { echo "[$(date -u +%T) left $(left)s] $*"; }
run() {  # a decodelab verb making $2 (kept when an earlier call made it), logged and recorded;
	# $launch (taskset ...) before it where set
	local name=$1 made=$2 start=$SECONDS
	shift 2
	[ -e "$made" ] && return 0
	timeout "$(($(left) > 30 ? $(left) - 30 : 1))" ${launch:-} python3 -m decodelab.cli "$@" >"$log/$name.log" 2>&1 ||
		{ say "FAILED: $name"; tail -n 5 "$log/$name.log"; return 1; }
	echo "${launch:+$launch }decodelab $*  # $((SECONDS - start)) s" >>"$ref/commands.sh"
}
{ date -u; nvidia-smi 2>&1 | head -15; python3 -c "import torch, transformers
print('torch', torch.__version__, 'transformers', transformers.__version__)"; } >"$log/env.txt"

for m in $models; do
	preset=$m
	run "prepare_$m" models/$m prepare-model --spec "{\"source\": \"init\", \"preset\": \"$preset\", \"seed\": 1}" \
		--out models/$m || exit 1
done
say "models ready: $models"
sweep='"budgets": [16, 32, 64, 128, 256], "prompt_lengths": [32], "dtype": "float16", "inner_repeats": 2, "warmup": 2, "seed": 20261130'
[ "$backend" = cpu ] && sweep=${sweep/float16/float32}
for rep in $(seq 0 $((reps - 1))); do
	for m in $models; do
		for engine in $engines; do
			[ "$(left)" -gt 60 ] || break 3
			launch=
			case $engine in
			pinned)
				launch="taskset -c $pin"
				spec="{$sweep, \"sdp_backends\": [\"flash\", \"mem_efficient\", \"math\"]}"
				;;
			graph) spec="{$sweep, \"engine\": \"graph\", \"sdp_backends\": [\"flash\", \"mem_efficient\", \"math\"]}" ;;
			*) spec="{$sweep, \"sdp_backends\": [\"flash\", \"mem_efficient\", \"math\"]}" ;;
			esac
			[ "$backend" = cpu ] && spec="{$sweep}"
			run "sweep_${engine}_${m}_$rep" "$ref/raw/$engine/$m/rep$rep.parquet" sweep --model-dir models/$m \
				--model "$m" --backend "$backend" --experiment sweep --spec "$spec" --repeat "$rep" \
				--out "$ref/raw/$engine/$m/rep$rep.parquet"
		done
	done
	say "process $rep done"
done

launch=
mkdir -p "$ref/stats"
for engine in $engines; do
	shopt -s nullglob
	raws=("$ref"/raw/"$engine"/*/rep*.parquet)
	[ ${#raws[@]} -gt 0 ] || continue
	run "verdicts_$engine" /nonexistent verdicts --study sweep --spec '{}' \
		--out "$ref/stats/verdicts_sweep_$engine.csv" "${raws[@]}"
done
python3 - "$ref/stats" <<'EOF' | tee "$log/summary.txt"
import glob, sys
import pandas as pd
for path in sorted(glob.glob(f"{sys.argv[1]}/verdicts_sweep_*.csv")):
    v = pd.read_csv(path)
    print(path.rsplit("_", 1)[-1][:-4], "configurations", len(v), "median cv between processes",
          round(v["cv_between"].median(), 4), "within 3%:", int((v["cv_between"] <= 0.03).sum()))
    print(v.groupby("model")["cv_between"].describe().round(4).to_string())
EOF
cp "$repo/scripts/gpu_sweeps.sh" "$ref/"
tar czf "$out/gpu-sweeps.tgz" "$ref" && say "wrote $out/gpu-sweeps.tgz"
