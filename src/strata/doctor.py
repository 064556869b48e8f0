"""`strata doctor`: what this machine offers strata, and a device self-test on every GPU."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from strata.devices import cuda_version_text, devices
from strata.hostinfo import host_info

GIB = 1024**3
MIN_COMPUTE_CAPABILITY = (8, 0)


def self_test(device: int, rng: np.random.Generator | None = None) -> float:
    """Runs a kernel through the whole native chain on `device`; returns the max relative error vs numpy."""
    from strata import _native

    rng = rng or np.random.default_rng()
    x = rng.standard_normal((64, 2560), dtype=np.float32)
    w = rng.standard_normal(2560, dtype=np.float32)
    got = _native.rms_norm(x, w, 1e-6, device)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-6) * w
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def run(write: Callable[[str], None] = print) -> int:
    """Prints the report; returns the process exit code (non-zero only when a self-test fails)."""
    from strata import _native

    host = host_info()
    write(f"host      {host.cpu_model}")
    write(
        f"          {host.physical_cores} physical cores ({host.logical_cpus} logical), "
        f"{host.numa_nodes} NUMA node(s), {host.ram_bytes / GIB:.1f} GiB RAM"
    )
    write(f"SIMD      {' '.join(host.simd) or 'none of AVX2 / AVX-512 / AMX'}")
    write(
        f"CUDA      driver {cuda_version_text(_native.driver_version())}, "
        f"runtime {cuda_version_text(_native.runtime_version())} (built in)"
    )
    gpus = devices()
    if not gpus:
        write("GPU       none: no NVIDIA driver or GPU found. strata needs an NVIDIA GPU of compute")
        write("          capability 8.0 or newer to run models; file tools (info, convert, synth) still work.")
        return 0
    status = 0
    for gpu in gpus:
        major, minor = gpu.compute_capability
        write(
            f"GPU {gpu.index}     {gpu.name}, sm_{major}{minor}, {gpu.sm_count} SMs, "
            f"{gpu.total_memory / GIB:.1f} GiB ({gpu.free_memory / GIB:.1f} GiB free)"
        )
        if gpu.compute_capability < MIN_COMPUTE_CAPABILITY:
            write("          unsupported: strata needs compute capability >= 8.0")
            status = 1
            continue
        error = self_test(gpu.index)
        ok = error < 1e-5
        verdict = "OK" if ok else "FAILED"
        write(f"self-test GPU {gpu.index}: rms_norm vs numpy, max relative error {error:.1e}: {verdict}")
        status |= 0 if ok else 1
    return status
