# Where scripts/env.sh keeps each PyTorch it installs: one environment per
# torch version, outside the clone, shared by every clone on the machine
# (GPU_LEAK_TEST_CACHE_DIR overrides the parent folder). Sourced by env.sh,
# and by .ci/run to check for room before anything is installed.
_cache_root=${GPU_LEAK_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-leak-test}
# The environment of one torch version.
_venv_of() { echo "$_cache_root/torch-$1"; }
