#!/usr/bin/env bash
# Installs the CUDA toolkit parts strata's build needs (nvcc, the static runtime, headers) inside
# cibuildwheel's manylinux_2_28 container (AlmaLinux 8), from NVIDIA's rhel8 repository.
set -euo pipefail
CUDA_VERSION=${CUDA_VERSION:-13.0}
dashed=${CUDA_VERSION//./-}
dnf install -y dnf-plugins-core
dnf config-manager --add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
dnf install -y "cuda-nvcc-${dashed}" "cuda-cudart-devel-${dashed}" "cuda-cccl-${dashed}" "cuda-crt-${dashed}"
ln -sfn "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
