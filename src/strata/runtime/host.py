"""Facts about the host that decide how strata runs: CPU model, SIMD features, physical cores, RAM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# cpuinfo flag -> the name strata reports. The pool's kernels pick among these at run time.
SIMD_FLAGS = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX-512F",
    "avx512bw": "AVX-512BW",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_tile": "AMX",
    "amx_int8": "AMX-INT8",
    "amx_bf16": "AMX-BF16",
}


@dataclass(frozen=True)
class HostInfo:
    cpu_model: str
    simd: tuple[str, ...]
    logical_cpus: int
    physical_cores: int
    numa_nodes: int
    ram_bytes: int


def _cpuinfo(text: str) -> tuple[str, set[str]]:
    model, flags = "unknown", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _physical_cores(sys_cpu: Path) -> int:
    cores = set()
    for topology in sys_cpu.glob("cpu[0-9]*/topology"):
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((package, core))
    return len(cores) or (os.cpu_count() or 1)


def meminfo_bytes(meminfo: str, field: str) -> int:
    """A /proc/meminfo field (e.g. "MemTotal", "MemAvailable") in bytes; 0 when absent."""
    for line in meminfo.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def available_ram_bytes(proc: Path = Path("/proc")) -> int:
    """RAM the kernel could give a new allocation now (MemAvailable); 0 when unknown."""
    try:
        return meminfo_bytes((proc / "meminfo").read_text(), "MemAvailable")
    except OSError:
        return 0


def host_info(proc: Path = Path("/proc"), sys_devices: Path = Path("/sys/devices/system")) -> HostInfo:
    """Reads /proc and /sys (Linux). Missing files give 'unknown' / zero rather than an error."""
    try:
        model, flags = _cpuinfo((proc / "cpuinfo").read_text())
    except OSError:
        model, flags = "unknown", set()
    try:
        ram = meminfo_bytes((proc / "meminfo").read_text(), "MemTotal")
    except OSError:
        ram = 0
    numa = len(list((sys_devices / "node").glob("node[0-9]*"))) or 1
    return HostInfo(
        cpu_model=model,
        simd=tuple(name for flag, name in SIMD_FLAGS.items() if flag in flags),
        logical_cpus=os.cpu_count() or 1,
        physical_cores=_physical_cores(sys_devices / "cpu"),
        numa_nodes=numa,
        ram_bytes=ram,
    )
