#!/bin/sh
# The quantized backend's tools (`make quantized-tools`): llama-cpp-python built from its source
# distribution once per machine into a wheel kept in $WHEELS and installed into the venv,
# llama.cpp's converter (convert_hf_to_gguf.py, conversion/, the gguf-py it is written against)
# kept from the same sdist in $CONVERTER, and with --peer (`make quantized-peer`) llama.cpp's
# llama-speculative and llama-completion (the peer, decodelab.backends.llamapeer) built from the
# llama.cpp it vendors into $PEER, with the wheel's flags. Nothing of llama.cpp is committed.
# Usage: scripts/quantized_tools.sh PYTHON VERSION [--peer]
set -eu
python=$1
version=$2
with_peer=${3:-}
cache=${XDG_CACHE_HOME:-$HOME/.cache}
wheels=${DECODELAB_WHEELS:-$cache/decodelab-wheels}
converter=${DECODELAB_LLAMA_CONVERTER:-$cache/decodelab/llama.cpp-converter-$version}
# A portable CPU build (no -march=native, no multimodal library); CMAKE_ARGS from the
# environment replaces it (Metal on a Mac is llama.cpp's default; CUDA: -DGGML_CUDA=on).
cmake_args=${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF}
sdist_dir=$cache/decodelab/llama-cpp-python-sdist
peer=${DECODELAB_LLAMA_PEER:-$cache/decodelab/llama.cpp-peer-$version}

sdist() {
	[ -n "$(ls "$sdist_dir"/llama_cpp_python-"$version".tar.gz 2>/dev/null)" ] ||
		"$python" -m pip download --quiet --no-deps --no-binary :all: -d "$sdist_dir" \
			"llama-cpp-python==$version"
	echo "$sdist_dir/llama_cpp_python-$version.tar.gz"
}

if [ ! -f "$converter/conversion/__init__.py" ]; then
	tmp=$(mktemp -d)
	tar -xzf "$(sdist)" -C "$tmp"
	src=$tmp/llama_cpp_python-$version/vendor/llama.cpp
	mkdir -p "$converter"
	cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$converter/"
	rm -rf "$tmp"
fi

if [ "$with_peer" = --peer ] && { [ ! -x "$peer/llama-speculative" ] ||
	[ ! -x "$peer/llama-completion" ]; }; then
	src=$cache/decodelab/llama.cpp-src-$version  # kept until built: a failed build resumes
	[ -d "$src" ] || { mkdir -p "$src" && tar -xzf "$(sdist)" -C "$src" --strip-components=3 \
		"llama_cpp_python-$version/vendor/llama.cpp"; }
	# shellcheck disable=SC2086
	"$(dirname "$0")/llama_peer_build.sh" "$src" "$src-build" "$peer" $cmake_args
	rm -rf "$src" "$src-build" "$src-build.configure.log"
fi

if "$python" -c "import importlib.metadata as m, sys; \
sys.exit(m.version('llama_cpp_python') != '$version')" 2>/dev/null; then
	exit 0
fi
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
	for tool in cmake gcc g++; do
		command -v $tool >/dev/null 2>&1 || {
			echo "llama-cpp-python $version builds llama.cpp from source and needs $tool:" \
				"install it (Debian: apt-get install cmake build-essential)" >&2
			exit 1
		}
	done
	echo "building llama-cpp-python $version (CMAKE_ARGS=$cmake_args), minutes on 2 cores"
	CMAKE_ARGS=$cmake_args "$python" -m pip wheel --quiet --no-deps -w "$wheels" "$(sdist)" || {
		echo "llama-cpp-python $version did not build (CMAKE_ARGS=$cmake_args); see above" >&2
		exit 1
	}
	wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n 1)
fi
"$python" -m pip install --quiet "$wheel"
