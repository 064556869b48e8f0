"""`strata doctor`: what this machine offers strata, and a device self-test on every GPU."""

from __future__ import annotations

from collections.abc import Callable

from strata.devices import cuda_version_text, devices
from strata.runtime.host import host_info

HELP = "what this machine offers strata, and a GPU self-test"
GIB = 1024**3
MIN_COMPUTE_CAPABILITY = (8, 0)


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
        error = _native.self_test(gpu.index)
        ok = error < 1e-5
        verdict = "OK" if ok else "FAILED"
        write(f"self-test GPU {gpu.index}: rms_norm vs the host in float64, max relative error {error:.1e}: {verdict}")
        status |= 0 if ok else 1
    return status


def register(commands) -> None:
    commands.add_parser("doctor", help=HELP).set_defaults(handler=handle)


def handle(_args) -> int:
    import strata

    print(f"strata {strata.__version__}")
    return run()
