"""Host facts are parsed from /proc and /sys as Linux writes them."""

from pathlib import Path

from strata.runtime.host import available_ram_bytes, host_info

CPUINFO = """processor\t: 0
model name\t: Test CPU 9000
flags\t\t: fpu sse avx2 fma avx512f avx512bw avx512_vnni amx_tile amx_int8

processor\t: 1
model name\t: Test CPU 9000
flags\t\t: fpu sse avx2 fma avx512f avx512bw avx512_vnni amx_tile amx_int8
"""


def _fake_machine(root: Path, cores: list[tuple[int, int]]) -> tuple[Path, Path]:
    proc = root / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:  1 kB\n")
    system = root / "system"
    for cpu, (package, core) in enumerate(cores):
        topology = system / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    for node in range(2):
        (system / "node" / f"node{node}").mkdir(parents=True)
    return proc, system


def test_smt_siblings_count_as_one_physical_core(tmp_path):
    # 2 packages x 2 cores x 2 SMT threads.
    cores = [(p, c) for p in range(2) for c in range(2)] * 2
    proc, system = _fake_machine(tmp_path, cores)
    info = host_info(proc, system)
    assert info.physical_cores == 4
    assert info.numa_nodes == 2
    assert info.ram_bytes == 131072000 * 1024
    assert available_ram_bytes(proc) == 0  # the fake meminfo has no MemAvailable line
    assert info.cpu_model == "Test CPU 9000"
    assert info.simd == ("AVX2", "FMA", "AVX-512F", "AVX-512BW", "AVX-512 VNNI", "AMX", "AMX-INT8")


def test_missing_files_give_unknown_not_an_error(tmp_path):
    info = host_info(tmp_path / "no-proc", tmp_path / "no-sys")
    assert info.cpu_model == "unknown"
    assert info.simd == ()
    assert info.physical_cores >= 1 and info.ram_bytes == 0


def test_this_machine_reads():
    info = host_info()
    assert info.physical_cores >= 1 and info.logical_cpus >= info.physical_cores
    assert 0 < available_ram_bytes() <= info.ram_bytes
