"""The network ``perfkit predict`` costs collectives on (issue 57): read from real nccl-tests and
rccl-tests tables (``shared/reference/native/``), two levels (one node, across nodes), what it
knows and what it extrapolates said beside each figure."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from perfkit.analyse.commfit import fit_alpha_beta
from perfkit.analyse.network_model import ring_hops
from perfkit.core.errors import BadInputError
from perfkit.ingest import nccl_tests
from perfkit.ingest.network import read_network

NATIVE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "native"
H100_2NODE = NATIVE / "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt"
MI300X_NODE = NATIVE / "rccl-tests-mi300x-vf-8gpu-allreduce.txt"
CRASHED = NATIVE / "nccl-tests-2.17.8-gh200-8rank-cuda-busy-failure.txt"
GB10 = NATIVE / "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt"
A100_RS = NATIVE / "nccl-tests-legacy-a100-8gpu-reducescatter-superbench.log"


def _need(*paths: Path) -> None:
    for path in paths:
        if not path.exists():
            pytest.skip(f"{path} is absent (shared/reference/ sits beside the repository)")


def test_a_binary_that_crashed_before_its_table_is_a_failed_run_not_lost_in_the_next(tmp_path):
    """Two binaries in one log, the first failing on 'CUDA-capable device(s) is/are busy': its lines
    no longer merge into the second run (whose '# nccl-tests version' line overwrote its own)."""
    _need(CRASHED, GB10)
    text = CRASHED.read_text() + GB10.read_text()
    parsed = nccl_tests.parse(text, source="log")
    assert [p.finished for p in parsed.parts] == [False, True]
    assert "failed before its table" in parsed.parts[0].reason and "busy or unavailable" in parsed.parts[0].reason
    assert {r["op"] for r in parsed.rows} == {"all_gather"} and {r["run_index"] for r in parsed.rows} == {2}
    assert parsed.facts["hosts"] == 2  # the run that finished
    # perfkit import says which run failed
    from perfkit.ingest.store import import_files

    log = tmp_path / "loop.log"
    log.write_text(text)
    done = import_files("nccl-tests", [log], tmp_path / "out")
    assert len(done.failed_runs) == 1 and "run 1 of 2" in done.failed_runs[0]
    with pytest.raises(BadInputError, match="every one of its 2 runs failed"):
        nccl_tests.parse(CRASHED.read_text() + CRASHED.read_text(), source="log")


def test_two_runs_of_one_op_under_different_settings_are_two_fits_and_the_network_says_which_it_uses(tmp_path):
    """The H100 table, then the same binary again with every time doubled (another NCCL_ALGO, say):
    pooled they were one fit of neither; now each run is fitted on its own."""
    _need(H100_2NODE)
    text = H100_2NODE.read_text()

    def doubled(line: str) -> str:
        cells = line.split()
        if len(cells) >= 13 and cells[0].isdigit():
            for k in (5, 9):  # out-of-place and in-place time (us) doubled, bandwidths from it
                time_us = 2 * float(cells[k])
                algbw = float(cells[0]) / (time_us * 1e-6) / 1e9
                cells[k:k + 3] = [f"{time_us:.1f}", f"{algbw:.2f}", f"{algbw * 2 * 15 / 16:.2f}"]
            return "  ".join(cells)
        return line
    second = "\n".join(doubled(line) for line in text.splitlines())
    rows = pd.DataFrame(nccl_tests.parse(text + "\n" + second, source="two").rows)
    fits = fit_alpha_beta(rows)
    out = fits[(fits["op"] == "all_reduce") & ~fits["inplace"].astype(bool)].sort_values("run_index")
    assert list(out["run_index"]) == [1, 2]
    ratio = out["beta_bytes_per_s"].iloc[0] / out["beta_bytes_per_s"].iloc[1]
    assert ratio == pytest.approx(2.0, rel=0.02)
    path = tmp_path / "two.txt"
    path.write_text(text + "\n" + second)
    net = read_network(path)
    assert any("2 runs at 16 ranks (runs 1, 2)" in n and "uses run 2's" in n for n in net.assumptions())


def test_the_ring_model_at_the_measured_size_follows_the_measured_times_where_they_are_bandwidth_bound():
    """Against the table's own rows, not its coefficients: at 16 ranks every measured size from
    1 GiB to 16 GiB within 3 %, and a 4 KiB message (never measured) flagged, its α bounded by the
    smallest message's time since the sizes did not resolve it."""
    _need(H100_2NODE)
    net = read_network(H100_2NODE)
    rows = pd.DataFrame(nccl_tests.parse(H100_2NODE.read_text()).rows)
    rows = rows[~rows["inplace"].astype(bool)]
    assert len(rows) >= 5
    for size, measured in zip(rows["size_bytes"], rows["time_s"]):
        assert net.time_s("all_reduce", size, 16) == pytest.approx(measured, rel=0.03), size
    link = net.links["all_reduce"]
    assert "α not resolved" in link.note and "bounded by the smallest message's time" in link.note
    assert ring_hops("all_reduce", 16) * link.alpha_hop_s <= rows["time_s"].min()
    assert "below the smallest all_reduce measured" in net.size_flag("all_reduce", 4096, 16)
    assert net.size_flag("all_reduce", 2**31, 16) is None
    assert "above the largest" in net.size_flag("all_reduce", 2**36, 16)


def test_two_levels_a_node_on_its_own_links_and_a_larger_group_on_the_inter_node_ones():
    _need(H100_2NODE, MI300X_NODE)
    inter = read_network(H100_2NODE)
    assert inter.hosts == 2 and inter.measured_world_size == 16
    # One table across two nodes: 8 ranks fit in a node, costed on the inter-node links, said.
    assert "8 ranks fit in one node (8 GPUs a node)" in inter.extrapolation(8) and "upper bound" in inter.extrapolation(8)
    assert inter.extrapolation(16) is None and "4x beyond the 16 ranks" in inter.extrapolation(64)
    node = read_network(MI300X_NODE)
    assert node.hosts == 1
    assert "no inter-node table given" in node.extrapolation(16) and "lower bound" in node.extrapolation(16)
    both = read_network(H100_2NODE, MI300X_NODE)
    assert both.gpus_per_node == 8
    for size in (2**20, 2**30):
        assert both.time_s("all_reduce", size, 8) == node.time_s("all_reduce", size, 8)
        assert both.time_s("all_reduce", size, 16) == inter.time_s("all_reduce", size, 16)
    assert both.extrapolation(8) is None
    assert any(a.startswith("groups of up to 8 ranks (one node): ") for a in both.assumptions())
    four = read_network(H100_2NODE, MI300X_NODE, gpus_per_node=4)
    assert four.level(4) is four.intra and four.level(8) is four
    with pytest.raises(BadInputError, match="ran on one host: pass the inter-node"):
        read_network(MI300X_NODE, MI300X_NODE)
    with pytest.raises(BadInputError, match="an intra-node table runs on one"):
        read_network(H100_2NODE, H100_2NODE)


def test_rows_of_zero_bytes_are_left_out_and_said():
    _need(A100_RS)
    net = read_network(A100_RS)
    assert any(re.search(r"10 rows of 0 bytes .* left out", a) for a in net.assumptions())
    assert net.links["reduce_scatter"].min_size_bytes > 0 and net.hosts == 1


def test_a_rejected_fit_still_predicts_and_says_how_poor():
    """A gloo network measured on a machine too busy to measure (times off by up to 70 % from a
    line): every fit is rejected, the network is still costed on the best one and every assumption
    says so, where it once refused to predict at all."""
    import numpy as np

    from perfkit.analyse.network_model import network_from_rows

    rng = np.random.default_rng(0)
    sizes = [2**k for k in range(10, 23)]
    rows = pd.DataFrame([{"workload": "collectives", "status": "ok", "op": "all_reduce", "inplace": False,
                          "world_size": 2, "size_bytes": s, "backend": "gloo",
                          "time_s": (2e-4 + s / 1e9) * float(rng.choice([0.3, 1.0, 1.7]))} for s in sizes])
    assert not fit_alpha_beta(rows)["fit_ok"].any()
    net = network_from_rows(rows, "busy")
    note = net.links["all_reduce"].note
    assert "REJECTED" in note and "relative RMS residual" in note
    assert net.time_s("all_reduce", 2**20, 2) > 0
    assert any("REJECTED" in a for a in net.assumptions())
    one_size = rows[rows["size_bytes"] == 1024]
    with pytest.raises(BadInputError, match="no all_reduce, all_gather or reduce_scatter with an α-β fit"):
        network_from_rows(one_size, "one size")


def _gloo_rows(ops, backend="gloo", spike_s=3e-3, seed=0):
    """Collectives rows as perfkit records them (raw samples kept): 10 samples a size on an α-β
    line (an all-reduce's twice an all-gather's, as a ring's), one in five delayed by ``spike_s``
    (a thread woken late)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for op in ops:
        for s in [2**k for k in range(10, 23, 2)]:
            base = (2 if op == "all_reduce" else 1) * (3e-4 + s / 1e9)
            samples = [base * (1 + 0.01 * rng.standard_normal()) + (spike_s if k % 5 == 0 else 0.0) for k in range(10)]
            rows.append({"workload": "collectives", "status": "ok", "op": op, "inplace": False, "world_size": 2,
                         "size_bytes": s, "backend": backend, "time_s": float(np.mean(samples)),
                         "time_samples_s": samples})
    return pd.DataFrame(rows)


def test_each_collective_costs_its_mean_the_median_curve_plus_the_tables_mean_excess():
    """A step pays every call in full: the curve follows the medians, and each call adds the mean
    excess of the raw samples over their size's median (here 2 of 10 samples 3 ms late: 0.6 ms);
    a table without raw samples (nccl-tests prints means) adds nothing."""
    import numpy as np

    from perfkit.analyse.network_model import network_from_rows

    rows = _gloo_rows(["all_gather"])
    net = network_from_rows(rows, "spiky")
    excess = np.concatenate([np.asarray(s) - np.median(s) for s in rows["time_samples_s"]]).mean()
    assert net.links["all_gather"].tail_s == pytest.approx(excess) and excess == pytest.approx(6e-4, rel=0.05)
    for size, samples in zip(rows["size_bytes"], rows["time_samples_s"]):
        assert net.time_s("all_gather", size, 2) == pytest.approx(np.median(samples) + excess, rel=0.05)
    assert any(re.search(r"at its mean time.*all_gather (59\d|60\d) us", a) for a in net.assumptions())
    means = network_from_rows(rows.drop(columns="time_samples_s"), "means")
    assert means.links["all_gather"].tail_s == 0.0


def test_gloo_runs_a_reduce_scatter_as_an_all_reduce_of_the_whole_input():
    """torch's gloo backend has no reduce-scatter of its own (its traces show ``gloo:all_reduce``):
    with no reduce-scatter fitted, a gloo one is costed as the all-reduce it is; NCCL's borrows the
    all-gather's links, the ring's reduce-scatter; a fitted gloo reduce-scatter is used as measured."""
    from perfkit.analyse.network_model import network_from_rows

    gloo = network_from_rows(_gloo_rows(["all_gather", "all_reduce"], spike_s=0.0), "gloo")
    assert gloo.time_s("reduce_scatter", 2**22, 2) == gloo.time_s("all_reduce", 2**22, 2)
    assert gloo.time_s("reduce_scatter", 2**22, 2) > 1.5 * gloo.time_s("all_gather", 2**22, 2)
    assert any("gloo runs it as an all-reduce" in a for a in gloo.assumptions())
    nccl = network_from_rows(_gloo_rows(["all_gather", "all_reduce"], backend="nccl", spike_s=0.0), "nccl")
    assert nccl.time_s("reduce_scatter", 2**22, 2) == nccl.time_s("all_gather", 2**22, 2)
    fitted = network_from_rows(_gloo_rows(["all_gather", "reduce_scatter"], spike_s=0.0), "gloo rs")
    assert fitted.time_s("reduce_scatter", 2**22, 2) == pytest.approx(3e-4 + 2**22 / 1e9, rel=0.02)
    only_ag = network_from_rows(_gloo_rows(["all_gather"], spike_s=0.0), "gloo ag")  # no loop between the fallbacks
    assert only_ag.time_s("reduce_scatter", 2**22, 2) == only_ag.time_s("all_reduce", 2**22, 2) > 0
