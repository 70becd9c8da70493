# Source this file: it provisions (or reuses) a Python environment with the
# PyTorch of one supported tch release, then exports what builds and test
# runs need.
#
#   . scripts/env.sh                          # tch 0.24, PyTorch 2.11 (the default)
#   GPU_LEAK_TEST_TCH=0.26.0 . scripts/env.sh # tch 0.26, PyTorch 2.13
#
# The releases and their PyTorch come from libtorch-versions.tsv. The
# environment lives outside the clone, keyed by torch version, so every
# clone on the machine shares one 4.6 GB install per version. Override its
# parent folder with GPU_LEAK_TEST_CACHE_DIR.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU_LEAK_TEST_TCH=${GPU_LEAK_TEST_TCH:-$(awk '!/^#/ && NF { print $1; exit }' "$_repo/libtorch-versions.tsv")}
_row=$(awk -v tch="$GPU_LEAK_TEST_TCH" '!/^#/ && $1 == tch' "$_repo/libtorch-versions.tsv")
if [ -z "$_row" ]; then
    echo "gpu-leak-test: GPU_LEAK_TEST_TCH=$GPU_LEAK_TEST_TCH is not a supported tch release; libtorch-versions.tsv lists: $(awk '!/^#/ && NF { printf "%s ", $1 }' "$_repo/libtorch-versions.tsv")" >&2
    return 1 2>/dev/null || exit 1
fi
TORCH_VERSION=$(echo "$_row" | cut -f3)
# The CUDA runtime headers' crt/ folder, which the torch wheel's own CUDA
# packages leave out; the shim needs it to compile the CUDA trace tracker
# (process scope). Headers only: about 1 MB.
CUDA_CRT=nvidia-cuda-crt==$(echo "$_row" | cut -f4)
. "$_repo/scripts/torch-cache.sh"
GPU_LEAK_TEST_VENV=$(_venv_of "$TORCH_VERSION")

# Finding torch's folder and version without importing it keeps this fast and quiet.
_torch_dir() {
    "$GPU_LEAK_TEST_VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])' 2>/dev/null
}
if [ "$(cat "$(_torch_dir)/version.py" 2>/dev/null | sed -n "s/^__version__ = '\([0-9.]*\).*/\1/p")" != "$TORCH_VERSION" ]; then
    echo "gpu-leak-test: installing torch==$TORCH_VERSION into $GPU_LEAK_TEST_VENV (once per machine, about 5 GB)" >&2
    mkdir -p "$_cache_root"
    # Build in a temporary folder and move it into place, so an interrupted
    # install is never mistaken for a finished one. pip keeps no copy of
    # the wheels (several GB): the environment is the cache.
    _tmp_venv=$(mktemp -d "$_cache_root/.venv-XXXXXX")
    python3 -m venv "$_tmp_venv" &&
        "$_tmp_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "torch==$TORCH_VERSION" "$CUDA_CRT" &&
        rm -rf "$GPU_LEAK_TEST_VENV" &&
        mv "$_tmp_venv" "$GPU_LEAK_TEST_VENV" ||
        { echo "gpu-leak-test: installing torch failed; see the pip output above" >&2; rm -rf "$_tmp_venv"; return 1 2>/dev/null || exit 1; }
fi
# Caches made before the trace tracker existed lack crt/; add it in place.
if [ ! -f "$(_torch_dir)/../nvidia/cu13/include/crt/host_defines.h" ]; then
    "$GPU_LEAK_TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$CUDA_CRT" ||
        echo "gpu-leak-test: warning: could not install $CUDA_CRT; process scope will not see CUDA" >&2
fi

export GPU_LEAK_TEST_TCH GPU_LEAK_TEST_VENV
export PATH="$GPU_LEAK_TEST_VENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
export LIBTORCH_BYPASS_VERSION_CHECK=${LIBTORCH_BYPASS_VERSION_CHECK:-0}
_torch_lib=$(_torch_dir)/lib
export LD_LIBRARY_PATH="$_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _repo _row _cache_root _tmp_venv _torch_lib CUDA_CRT
unset -f _torch_dir _venv_of
