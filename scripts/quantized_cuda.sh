#!/usr/bin/env bash
# The quantized backend on CUDA for the H200 reference, in one device call: llama-cpp-python built
# with CUDA from the source tree carried in .gpu/llama-src/ (the 0.3.36 sdist; the wheel is kept
# in .gpu/wheels/ and reused when carried back), the trained pair (config.yaml's shapes, trained
# on the GPU) and init GPT-2 converted to F16/Q8_0/Q4_0 with the converter in that tree, each
# type's verify cost on CUDA (K = 1..16, every layer offloaded) beside PyTorch's, and speculative
# rows over a quantized CUDA target (greedy and sampled), and llama.cpp's own speculative example
# on the same GGUF pair (the peer: llama-speculative and llama-completion built from the wheel's
# CMake tree in .gpu/build, only those targets; from the carried source where that tree is not
# here), all through decodelab's CLI (no snakemake there). Writes $OUT/quantized-cuda.tgz:
# results/gpu-runs/cuda-h200/quantized/ (raw/, stats/, logs/, commands.sh, env.txt) and, when
# it was built here, the wheel.
# Usage: scripts/quantized_cuda.sh SECONDS [--no-build]   (--no-build: the installed llama_cpp)
# Shorter calls: DECODELAB_QUANT_PEER=0 (no peer), DECODELAB_QUANT_MIXED=0 (no PyTorch-draft pair),
# DECODELAB_QUANT_REPEATS=N (processes per measurement).
# Its test on a CPU: DECODELAB_QUANT_DEVICE=cpu DECODELAB_QUANT_STEPS=20
# DECODELAB_QUANT_GPT2=gpt2-tiny DECODELAB_QUANT_REPEATS=1 scripts/quantized_cuda.sh 900 --no-build
# A run lands in results/gpu-runs/ (raw rows, logs); what becomes a reference is its stats/ and a
# one-page README, copied into results/reference/<name>/ (results/reference/README.md).
set -uo pipefail
deadline=$((SECONDS + ${1:?usage: quantized_cuda.sh SECONDS [--no-build]}))
build=${2:-build}
device=${DECODELAB_QUANT_DEVICE:-cuda}  # cpu: the same steps on a CPU build (the script's test)
out=${OUT:-/tmp/quantized-cuda-out}
ref=${DECODELAB_QUANT_REF:-results/gpu-runs/cuda-h200/quantized}  # where a CPU run lands: DECODELAB_QUANT_REF
work=${DECODELAB_QUANT_WORK:-/tmp/quantized-cuda}
src=$PWD/.gpu/llama-src
# --exclude-libs: without it libllama's std::ostream calls can land in C++ runtime code inside
# libggml-cuda.so, which crashes once torch is loaded; symbols from static archives stay local.
cmake_args=${CMAKE_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 DECODELAB_LLAMA_CMAKE_ARGS=$cmake_args
export DECODELAB_LLAMA_CONVERTER=$src/vendor/llama.cpp
repo=$PWD
self=$(readlink -f "$0")
mkdir -p "$out" "$work/$ref/logs"
log=$work/$ref/logs
left() { echo $((deadline - SECONDS)); }
limit() { local s=$(($(left) - $1)); echo $((s > 1 ? s : 1)); }
say() { echo "[$(date -u +%T) left $(left)s] $*"; }
cmds=$work/$ref/commands.sh
echo "# scripts/quantized_cuda.sh $*: its commands in order, with their wall time (cwd: $work)" >>"$cmds"
run() {  # run a decodelab verb making $2, logged, timed, recorded, within the deadline;
	# what an earlier call on this machine made is kept (a rerun resumes)
	local name=$1 made=$2 start=$SECONDS
	shift 2
	[ -e "$made" ] && return 0
	timeout "$(limit 25)" python3 -m decodelab.cli "$@" >"$log/$name.log" 2>&1 ||
		{ say "FAILED: $name (tail of $log/$name.log)"; tail -n 5 "$log/$name.log"; return 1; }
	echo "decodelab $*  # $((SECONDS - start)) s" >>"$cmds"
}
pack() {
	cp "$self" "$work/$ref/"
	tar czf "$out/quantized-cuda.tgz" -C "$work" "$ref"
	say "wrote $out/quantized-cuda.tgz ($(du -h "$out/quantized-cuda.tgz" | cut -f1))"
	exit "${1:-0}"
}

if [ "$build" != --no-build ]; then
	wheel=$(ls .gpu/wheels/llama_cpp_python-*.whl 2>/dev/null | head -n 1)
	if [ -z "$wheel" ]; then
		say "building llama-cpp-python (CMAKE_ARGS=$cmake_args)"
		mkdir -p .gpu/wheels
		# The CMake tree in .gpu/build survives a call that runs out of time: the next call on the
		# same (warm) machine resumes it, when the carry names .gpu/llama-src, not all of .gpu.
		CMAKE_ARGS=$cmake_args CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout "$(limit 240)" \
			python3 -m pip wheel --no-deps --no-build-isolation --no-index -w .gpu/wheels \
			-C build-dir="$PWD/.gpu/build" "$src" \
			>"$log/build.log" 2>&1 || { say "build FAILED or out of time"; tail -n 20 "$log/build.log"; pack 1; }
		wheel=$(ls .gpu/wheels/llama_cpp_python-*.whl | head -n 1)
		cp "$wheel" "$out/"  # carried back as .gpu/wheels/ next time: no second build
	fi
	python3 -m pip install -q --no-deps --no-index --target /tmp/site "$wheel" .gpu/whl/*.whl \
		>"$log/install.log" 2>&1 || { say "install FAILED"; cat "$log/install.log"; pack 1; }
	export PYTHONPATH=/tmp/site:$PWD/src
	export DECODELAB_LLAMA_PEER=$PWD/.gpu/peer
	if [ "${DECODELAB_QUANT_PEER:-1}" = 1 ] && [ ! -x .gpu/peer/llama-speculative ]; then
		# the wheel's tree (this call or an earlier one on this machine) adds only two programs
		peer_tree=.gpu/build peer_src=$src
		[ -f .gpu/build/CMakeCache.txt ] || { peer_tree=.gpu/peer-build; peer_src=$src/vendor/llama.cpp; }
		say "building llama.cpp's peer programs in $peer_tree"
		# shellcheck disable=SC2086
		CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout "$(limit 200)" scripts/llama_peer_build.sh \
			"$peer_src" "$PWD/$peer_tree" .gpu/peer $cmake_args >"$log/peer-build.log" 2>&1 ||
			{ say "peer build FAILED or out of time"; tail -n 20 "$log/peer-build.log"; }
	fi
else
	export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
say "llama-cpp-python: $(python3 -c 'import llama_cpp as l; print(l.__version__, "gpu offload:", l.llama_supports_gpu_offload())')"
{ nvidia-smi 2>&1; python3 -m pip list 2>/dev/null; python3 -c \
	'import llama_cpp as l; print(l.llama_print_system_info().decode())'; } >"$work/$ref/env.txt"

cd "$work" || exit 1
model_spec() {  # config.yaml's trained model $1, trained on this script's device
	python3 -c "import json, sys, yaml; m = yaml.safe_load(open('$repo/config.yaml'))['models']
s = {**m[sys.argv[1]], 'device': '$device'}
s.update({'steps': int('$steps')} if '$steps' else {}); print(json.dumps(s))" "$1"
}
steps=${DECODELAB_QUANT_STEPS:-}
say "preparing the trained pair (on $device) and init ${DECODELAB_QUANT_GPT2:-gpt2}"
run prepare_target results/models/target prepare-model --spec "$(model_spec target)" \
	--out results/models/target || pack 1
run prepare_draft results/models/draft prepare-model --spec "$(model_spec draft)" \
	--teacher-dir results/models/target --out results/models/draft || pack 1
run prepare_gpt2 results/models/gpt2 prepare-model --out results/models/gpt2 \
	--spec "{\"source\": \"init\", \"preset\": \"${DECODELAB_QUANT_GPT2:-gpt2}\", \"seed\": 1}" || pack 1
for model in target draft gpt2; do
	for quant in F16 Q8_0 Q4_0; do
		run "gguf_${model}_$quant" results/gguf/$model/$quant.gguf convert-gguf \
			--model-dir results/models/$model --type $quant --out-dir results/gguf/$model || pack 1
	done
done
say "converted: $(ls results/gguf/*/ | tr '\n' ' ')"
[ "$device" = cpu ] && echo : >"$log/cuda_env.sh"  # the CPU build lives beside torch as is
if [ ! -s "$log/cuda_env.sh" ] && [ ! -s "$log/probe.txt" ]; then  # which process environment lets llama.cpp's CUDA live beside torch
	timeout "$(limit 60)" python3 "$repo/scripts/llama_cuda_probe.py" results/gguf/target/F16.gguf \
		results/gguf/draft/Q8_0.gguf "$log/cuda_env.sh" >"$log/probe.txt" 2>&1
	cat "$log/probe.txt"
	if [ ! -s "$log/cuda_env.sh" ] && command -v cuda-gdb >/dev/null; then
		say "no environment mends it: a backtrace of decodelab's engine beside torch"
		timeout 90 cuda-gdb -q -batch -ex run -ex bt --args python3 -c "import torch
from decodelab.backends.llamacpp import Engine
Engine('results/gguf/target/F16.gguf', device='$device')" >"$log/backtrace.txt" 2>&1
		grep -A 25 "received signal" "$log/backtrace.txt" | head -n 40
	fi
fi
# shellcheck disable=SC1091
llama_ok=0  # llama.cpp's rows need a process where it lives beside torch
[ -s "$log/cuda_env.sh" ] && . "$log/cuda_env.sh" && llama_ok=1 &&
	say "process environment: $(cat "$log/cuda_env.sh")"

par='{"ks": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], "context": 128, "inner": 5, "seed": 20261130'
h=$ref/raw
reps=${DECODELAB_QUANT_REPEATS:-3}  # processes per measurement (the speculative ones: up to 2)
for rep in $(seq 0 $((reps - 1))); do
	for model in target gpt2; do
		[ "$(left)" -gt 150 ] || break 2
		for quant in F16 Q8_0 Q4_0; do
			[ $llama_ok = 1 ] || break
			made=$h/llama.cpp-$quant-$device/parallelism/$model/rep$rep.parquet
			run "verify_${model}_${quant}_$rep" "$made" verify-cost --device "$device" \
				--gguf results/gguf/$model/$quant.gguf --model $model --repeat $rep \
				--spec "$par, \"dtype\": \"$quant\"}" --out "$made"
		done
		made=$h/$device/parallelism/$model/rep$rep.parquet
		run "parallelism_${model}_$rep" "$made" parallelism --model-dir results/models/$model \
			--model $model --backend "$device" --spec "$par, \"dtype\": \"float32\"}" \
			--repeat $rep --out "$made"
	done
	say "verify cost, process $rep done"
done

study='{"budget": 64, "hf_assisted": false, "ks": [1, 2, 4, 8], "modes": ["greedy", "sampled"], "prompt_len": 32, "prompts": 4, "seed": 20261130, "temperature": 1.0, "top_k": 0, "top_p": 1.0}'
pair() {  # name, target backend/quant, draft backend/quant, draft device
	local spec="{\"target\": \"target\", \"draft\": \"draft\", \"target_device\": \"$device\", \"draft_device\": \"$5\", \"dtype\": \"float32\", \"target_backend\": \"$2\", \"target_quant\": \"$3\""
	local gguf="--target-gguf results/gguf/target/$3.gguf"
	if [ "$4" != pytorch ]; then
		spec="$spec, \"draft_backend\": \"llamacpp\", \"draft_quant\": \"$4\""
		gguf="$gguf --draft-gguf results/gguf/draft/$4.gguf"
	fi
	for rep in $(seq 0 $((reps < 2 ? reps - 1 : 1))); do
		[ "$(left)" -gt 60 ] && [ $llama_ok = 1 ] || return 0
		run "speculative_$1_$rep" $h/speculative/$1/rep$rep.parquet speculative \
			--target-dir results/models/target \
			--draft-dir results/models/draft --pair "$1" --pair-spec "$spec}" --spec "$study" $gguf \
			--repeat $rep --out $h/speculative/$1/rep$rep.parquet
	done
	say "speculative $1 done"
}
pair q4-q8-$device llamacpp Q4_0 Q8_0 "$device"
[ "${DECODELAB_QUANT_MIXED:-1}" = 1 ] && pair cpu-q4-$device llamacpp Q4_0 pytorch cpu

peer() {  # llama.cpp's own speculative example on pair $1's GGUF files: target $2, draft $3
	for rep in $(seq 0 $((reps < 2 ? reps - 1 : 1))); do
		[ "$(left)" -gt 60 ] || return 0
		run "peer_$1_$rep" $h/llama.cpp-peer/$1/rep$rep.parquet llama-peer --pair "$1" \
			--target-gguf results/gguf/target/$2.gguf --draft-gguf results/gguf/draft/$3.gguf \
			--target-dir results/models/target --device "$device" --spec "$study" \
			--repeat $rep --out $h/llama.cpp-peer/$1/rep$rep.parquet
	done
	say "llama.cpp's own speculative on $1 done"
}
[ "${DECODELAB_QUANT_PEER:-1}" = 1 ] && peer q4-q8-$device Q4_0 Q8_0

say "statistics"
stats='{"confidence": 0.95, "bootstrap_resamples": 2000, "seed": 7}'
mkdir -p $ref/stats
shopt -s nullglob
spec_runs=($h/speculative/*/rep*.parquet)
verdicts=$ref/stats/verdicts_speculative.csv
run verdicts /nonexistent verdicts --study speculative --spec '{}' --out $verdicts "${spec_runs[@]}"
par_verdicts=$ref/stats/verdicts_parallelism.csv  # PyTorch's and llama.cpp's, judged alike
run par_verdicts /nonexistent verdicts --study parallelism --spec '{}' --out $par_verdicts \
	$h/*/parallelism/*/rep*.parquet
run spec_stats /nonexistent spec-stats --spec "$stats" --verdicts $verdicts --out $ref/stats \
	--runs "${spec_runs[@]}" --parallelism $h/$device/parallelism/*/rep*.parquet
run quantized_stats /nonexistent quantized-stats --spec "$stats" --stats $ref/stats --out $ref/stats \
	--verdicts $par_verdicts \
	--verify-cost $h/llama.cpp-*/parallelism/*/rep*.parquet --runs "${spec_runs[@]}" \
	--peer $h/llama.cpp-peer/*/rep*.parquet
python3 - "$ref/stats" <<'EOF' | tee "$log/summary.txt"
import sys
import pandas as pd
v = pd.read_csv(f"{sys.argv[1]}/quantized_verify_cost.csv")
print(v[v["k"].isin([4, 8, 16])][["backend", "model", "k", "ratio", "ci_low", "ci_high", "stable"]]
      .to_string(index=False))
s = pd.read_csv(f"{sys.argv[1]}/quantized_speculative.csv")
print(s[["pair", "mode", "k", "speedup", "agree", "diverged", "min_margin"]].to_string(index=False))
p = pd.read_csv(f"{sys.argv[1]}/quantized_peer.csv")
print(p[["pair", "mode", "k", "peer_speedup", "peer_acceptance", "peer_tokens_per_s",
         "decodelab_speedup", "decodelab_proposal_acceptance"]].to_string(index=False))
EOF
for m in target draft gpt2; do cp results/models/$m/decodelab.json $ref/logs/model_$m.json 2>/dev/null; done
pack 0
