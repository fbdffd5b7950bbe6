"""The CPU peak counts the physical cores a run had (issue 11, item 6): SMT siblings are one
core, the affinity mask and the compute threads bound the count, ranks sum and share cores.

Topologies are fake sysfs trees (``cpuN/topology/...``) built in tmp_path, as the kernel writes
them: 4 logical CPUs = 2 cores x 2 hardware threads, CPUs 0,1 on core 0 and 2,3 on core 1.
"""

from __future__ import annotations

import os

import pytest

from perfkit.core import cpu_share as cs
from perfkit.core import devices
from perfkit.analyse import mfu

# logical CPU -> (package, core): 2 cores x 2 threads, siblings numbered together
SMT_2X2 = {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}


def fake_sys(root, layout, *, siblings_lists=True):
    """A sysfs CPU tree for ``layout`` (cpu -> (package, core)); without ``siblings_lists`` only
    physical_package_id/core_id exist (older kernels, some containers)."""
    for cpu, (package, core) in layout.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
        if siblings_lists:
            sibs = sorted(c for c, pc in layout.items() if pc == (package, core))
            text = ",".join(map(str, sibs)) + "\n"
            (topo / "thread_siblings_list").write_text(text)
            (topo / "core_cpus_list").write_text(text)
    return root


@pytest.fixture
def smt(tmp_path):
    return fake_sys(tmp_path / "cpu", SMT_2X2)


def test_parse_cpu_list():
    assert cs.parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert cs.parse_cpu_list("5") == (5,)


@pytest.mark.parametrize("siblings_lists", [True, False], ids=["siblings-list", "core-id"])
def test_smt_siblings_are_one_core(tmp_path, siblings_lists):
    root = fake_sys(tmp_path / "cpu", SMT_2X2, siblings_lists=siblings_lists)
    assert cs.cpu_share(cpus={0, 1}, threads=2, root=root).cores == 1  # two threads, one core
    assert cs.cpu_share(cpus={0, 2}, threads=2, root=root).cores == 2
    whole = cs.cpu_share(cpus={0, 1, 2, 3}, threads=4, root=root)
    assert (whole.physical_cores, whole.cores) == (2, 2)  # 4 logical CPUs, 2 FMA-unit sets
    assert "sysfs" in whole.topology_source


def test_threads_bound_the_cores(smt):
    # OMP_NUM_THREADS=1 on the whole machine: one core computes.
    share = cs.cpu_share(cpus={0, 1, 2, 3}, threads=1, root=smt)
    assert (share.physical_cores, share.cores, share.threads) == (2, 1, 1)


def test_no_topology_counts_each_logical_cpu_and_says_so(tmp_path):
    share = cs.cpu_share(cpus={0, 1}, threads=2, root=tmp_path / "nothing")
    assert share.cores == 2 and "no CPU topology" in share.topology_source


def test_ranks_sum_and_share_cores(smt):
    one = cs.cpu_share(cpus={0, 1}, threads=1, root=smt, host="a")
    # Two 1-thread ranks on the two siblings of one core: one core between them.
    assert cs.run_cores([one, cs.cpu_share(cpus={0, 1}, threads=1, root=smt, host="a")])[0] == 1
    # On different cores: two.
    other = cs.cpu_share(cpus={2, 3}, threads=1, root=smt, host="a")
    cores, threads, how = cs.run_cores([one, other])
    assert (cores, threads) == (2, 2) and "capped" in how
    # Hosts never share cores.
    remote = cs.cpu_share(cpus={0, 1}, threads=1, root=smt, host="b")
    assert cs.run_cores([one, remote])[0] == 2
    # A share survives the JSON trip between ranks (lists back).
    again = cs.CpuShare(**{k: list(v) if isinstance(v, tuple) else v for k, v in one.as_dict().items()})
    assert again == one


@pytest.fixture
def this_process_on_siblings(monkeypatch, smt):
    """This process: affinity {0, 1} (siblings of one core) and 2 compute threads."""
    monkeypatch.setattr(cs, "SYS_CPU", smt)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(cs, "_torch_threads", lambda: 2)


def test_cpu_theoretical_peak_counts_physical_cores_of_the_affinity(this_process_on_siblings):
    peak = devices.cpu_theoretical_peak(flags={"avx2", "fma"}, clock_hz=3e9)
    assert peak.cores == 1  # two logical CPUs, one core: not 2
    assert peak.threads == 2 and "2 threads" in peak.cores_source
    assert peak.flop_per_s["fp32"] == pytest.approx(1 * 3e9 * 32)
    ceiling = devices.reference_ceilings(devices.DeviceInfo(
        kind="cpu", torch_device="cpu", name="x", count=2, memory_bytes=None))[0]
    assert ceiling["source"].startswith("1 physical cores")


def test_mfu_peak_is_of_what_the_ranks_had(smt):
    flags, clock = {"avx2", "fma"}, 3e9

    def peak(*shares):
        cpu = devices.cpu_theoretical_peak(flags=flags, clock_hz=clock, shares=list(shares))
        return mfu.peak_flop_per_s(device_kind="cpu", device_name="cpu", precision="fp32",
                                   devices=len(shares), cpu_peak=cpu)

    rank0 = cs.cpu_share(cpus={0, 1}, threads=1, root=smt, host="h")
    rank1 = cs.cpu_share(cpus={2, 3}, threads=1, root=smt, host="h")
    two = peak(rank0, rank1)
    assert two.flop_per_s == pytest.approx(2 * peak(rank0).flop_per_s)
    assert (two.cpu_cores, two.cpu_threads) == (2, 2)
    assert "2 physical cores" in two.description and "shared by 2 ranks" in two.description
    # Ranks given as dicts (as they come back from torchrun) give the same peak.
    same = mfu.peak_flop_per_s(device_kind="cpu", device_name="cpu", precision="fp32", devices=2,
                               cpu_shares=[rank0.as_dict(), rank1.as_dict()])
    assert (same.cpu_cores, same.cpu_threads) == (2, 2)


def test_training_row_states_threads_and_divides_by_their_cores(this_process_on_siblings):
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import train_step_benchmark

    row = train_step_benchmark(TrainConfig(model="mlp", batch_size=8, steps=3, warmup_steps=1,
                                           precision="fp32", device="cpu", count_flops=False))
    assert row["cpu_threads"] == 2 and row["cpu_cores_counted"] == 1
    assert row["peak_flop_per_s"] == pytest.approx(devices.cpu_theoretical_peak(cores=1).flop_per_s["fp32"])
    assert "1 physical cores" in row["mfu_convention"] and "2 threads" in row["mfu_convention"]


def test_a_thread_count_sets_every_thread_variable_and_an_omp_override_carries_mkl():
    from perfkit.core.cpu_share import thread_env, with_threads

    assert thread_env(3) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    slot = {**thread_env(2), "PERFKIT_SLOT": "cpu:0/1x2"}
    # OMP alone means the count: an inherited MKL_NUM_THREADS would win in torch.
    assert with_threads(slot, {"OMP_NUM_THREADS": "1"}) == {**thread_env(1), "PERFKIT_SLOT": "cpu:0/1x2"}
    # Both named: both kept as given; neither named: the base unchanged.
    assert with_threads(slot, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"})["MKL_NUM_THREADS"] == "2"
    assert with_threads(slot, {"OTHER": "x"}) == {**slot, "OTHER": "x"}
    assert slot["MKL_NUM_THREADS"] == "2"  # the base is not modified


@pytest.mark.parametrize("variables", [{"OMP_NUM_THREADS": "1"}, {"MKL_NUM_THREADS": "1"}, {}],
                         ids=["omp", "mkl-only", "unset"])
def test_the_threads_read_from_an_environment_are_the_ones_torch_starts_with(variables):
    """The sweep engine fingerprints a configuration's ending row without importing torch, from
    the kernel's environment (threads_from_env, else the affinity mask): torch must agree."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in cs.THREAD_VARIABLES}
    env.update(variables)
    probe = ("import os, torch; from perfkit.core.cpu_share import cpu_share, threads_from_env, affinity_cpus;"
             "print(torch.get_num_threads(), threads_from_env(os.environ) or len(affinity_cpus()))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    torch_threads, read = out.stdout.split()
    assert torch_threads == read, f"under {variables or 'no thread variable'} torch starts {torch_threads} threads, perfkit reads {read}"
