# Sourced by .ci/run and scripts/cuda-compile-check.sh: install NVRTC from pinned PyPI wheels
# into target/cuda-venv (once) and put its library on LD_LIBRARY_PATH; on success export
# SPECMLA_REQUIRE_NVRTC=1 so the compile-check test may not skip. Nothing here needs a GPU.
CUDA_VENV="${CUDA_VENV:-$PWD/target/cuda-venv}"
NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
if [ ! -d "$CUDA_VENV/lib" ] || ! ls "$CUDA_VENV"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.* >/dev/null 2>&1; then
  if command -v python3 >/dev/null; then
    python3 -m venv "$CUDA_VENV" >/dev/null 2>&1 \
      && "$CUDA_VENV/bin/pip" install -q --disable-pip-version-check "$NVRTC_WHEEL" \
      || echo "cuda-env: could not install $NVRTC_WHEEL; the CUDA compile check will be skipped"
  else
    echo "cuda-env: no python3; the CUDA compile check will be skipped"
  fi
fi
NVRTC_LIB="$(ls -d "$CUDA_VENV"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib 2>/dev/null | head -n 1 || true)"
if [ -n "$NVRTC_LIB" ] && ls "$NVRTC_LIB"/libnvrtc.so.* >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export SPECMLA_REQUIRE_NVRTC=1
  echo "cuda-env: NVRTC from $NVRTC_LIB"
fi
