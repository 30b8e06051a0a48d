#!/bin/sh
# llama.cpp's own speculative decoding, the quantized backend's peer: the `llama-speculative`
# example and `llama-completion` (its autoregressive decode on the same model) built with CMake from
# SOURCE (llama.cpp itself, or the llama-cpp-python sdist that vendors it) in BUILD, only those two
# targets, and copied to BIN. A BUILD that pip's wheel build already configured is reused (only the
# two programs and llama.cpp's common library are new).
# Usage: scripts/llama_peer_build.sh SOURCE BUILD BIN [CMAKE ARGUMENTS...]
set -eu
source_dir=$1
build=$2
bin=$3
shift 3
targets="llama-speculative llama-completion"
for tool in cmake gcc g++; do
	command -v $tool >/dev/null 2>&1 || {
		echo "llama.cpp's speculative example needs $tool: install it" \
			"(Debian: apt-get install cmake build-essential)" >&2
		exit 1
	}
done
echo "building llama.cpp's $targets in $build (minutes on 2 cores)"
cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF "$@" >"$build.configure.log" 2>&1 || {
	tail -n 20 "$build.configure.log" >&2
	echo "llama.cpp did not configure in $build; see $build.configure.log" >&2
	exit 1
}
# shellcheck disable=SC2086
nice -n 10 cmake --build "$build" --config Release --target $targets \
	--parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" || {
	echo "llama.cpp's $targets did not build in $build; see above" >&2
	exit 1
}
mkdir -p "$bin"
for target in $targets; do
	cp "$(find "$build" -name "$target" -type f -perm -u+x | head -n 1)" "$bin/"
done
echo "llama.cpp's peer programs are in $bin"
