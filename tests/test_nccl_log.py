"""NCCL_DEBUG=INFO parsing on the recorded reference logs, prefix variants, and the knob check.

The expected values below were read from the files in shared/reference/nccl-logs by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfkit.core.formulas import message_bytes
from perfkit.analyse.nccl_log import knob_check, observed, parse, summarize_check

_LOGS = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "nccl-logs"


def _raw(name: str) -> str:
    path = _LOGS / name
    if not path.exists():
        pytest.skip(f"reference log {path} is absent (shared/reference not checked out beside the repo)")
    return path.read_text()


def _text(name: str) -> str:
    """The log without the file's '#' annotation lines (which quote log lines themselves)."""
    return "".join(line for line in _raw(name).splitlines(keepends=True) if not line.startswith("#"))


def _excerpts(name: str) -> dict[str, str]:
    """The 2.27.5 file's excerpts, keyed by their letter ('# --- excerpt C: ...')."""
    parts, key = {}, None
    for line in _raw(name).splitlines():
        if line.startswith("# --- excerpt "):
            key = line.split()[3].rstrip(":")
            parts[key] = ""
        elif key:
            parts[key] += line + "\n"
    return parts


_V2275 = "nccl-2.27.5-sglang-16rank-env-ring-simple.log"


def test_nccl_2_12_12_banner_env_and_socket():
    log = parse(_text("nccl-2.12.12-ib-disable-socket-init.log"))
    assert (log.library, log.version, log.version_suffix) == ("NCCL", "2.12.12", "+cuda11.7")
    assert log.env.values.tolist() == [["NCCL_IB_DISABLE", "1"]]  # "to 1." loses its '.'
    assert log.networks == ("Socket",)
    assert log.tuning.empty and log.init.empty


def test_nccl_2_18_algo_list_echo_and_init_complete():
    log = parse(_text("nccl-2.18-h800-env-algo-list-init.log"))
    assert log.version is None  # no banner in this excerpt
    assert log.env_values("NCCL_ALGO") == ["Tree,Ring,,CollnetDirect,CollnetChain,NVLS"]
    assert len(log.env) == 4  # once per rank: ranks 6, 0, 5 and 7 are in the excerpt
    assert len(log.init) == 8
    assert sorted(log.init["rank"]) == list(range(8))
    assert set(log.init["nranks"]) == {8} and log.nranks == 8
    assert log.init.set_index("rank").loc[7, "bus_id"] == "d7000"
    assert log.init["nvml_dev"].tolist() == log.init["cuda_dev"].tolist()
    assert log.init["init_func"].isna().all()  # the ncclCommInitRank prefix comes with 2.21
    assert log.coll_channels == (16, 16, 16)


def test_nccl_2_22_3_numeric_tuning_including_the_glued_line():
    log = parse(_text("nccl-2.22.3-h100-24rank-tuning-numeric-nvls.log"))
    t = log.tuning
    assert len(t) == 11  # 5 × 8 bytes (one glued after nccl-tests output), 3 × 262144, 3 × 524288
    assert t["func"].isna().all()  # 2.20-2.22 print no function name
    pairs = t.drop_duplicates(["nbytes", "algo", "proto"])
    assert pairs[["nbytes", "algo", "proto"]].values.tolist() == [
        [8, "TREE", "LL"], [262144, "TREE", "LL128"], [524288, "NVLS_TREE", "SIMPLE"]]
    assert pairs[["algo_id", "proto_id"]].values.tolist() == [[0, 0], [0, 1], [5, 2]]
    assert t["time_us"].iloc[0] == pytest.approx(25.200924)
    assert (t["nbytes"] == 8).sum() == 5
    assert log.env_values("NCCL_CROSS_NIC") == ["2"]
    assert log.nranks == 24  # "comm ... rank 0 nRanks 24 nNodes 3"


def test_nccl_2_23_named_numeric_tuning_and_coll_lines_with_srun_prefix():
    log = parse(_text("nccl-2.23-fsdp-allgather-tuning-numeric-coll.log"))
    assert log.tuning[["func", "nbytes", "algo", "proto", "algo_id", "proto_id"]].values.tolist() == [
        ["AllGather", 37756928, "RING", "SIMPLE", 1, 2]]
    assert log.tuning["time_us"].iloc[0] == pytest.approx(2860.208008)
    c = log.coll
    assert len(c) == 9
    assert c["func"].value_counts().to_dict() == {"AllGather": 6, "Broadcast": 3}
    assert sorted(set(c["op_count"])) == [0x1606, 0x1607, 0x1608, 0x1609]  # opCount is hex
    first = c.iloc[0]
    assert (first["count"], first["datatype"], first["nranks"], first["comm"]) == (
        2359808, 7, 4, "0x555e2c6387e0")
    assert c[c["func"] == "Broadcast"]["count"].tolist() == [1, 1, 3145]
    assert log.nranks == 4
    # NCCL's TUNING nBytes for AllGather is S of formulas.md (count × elem_size × n): the
    # collectives rows match TUNING lines on size_bytes. datatype 7 is ncclFloat32.
    assert log.tuning["nbytes"].iloc[0] == message_bytes("all_gather", 2359808, 4, 4)


def test_nccl_2_27_5_named_tuning_env_matrix_and_init():
    log = parse(_text(_V2275))
    t = log.tuning
    assert t[["func", "nbytes", "algo", "proto", "channel_lo", "channel_hi"]].values.tolist() == [
        ["AllReduce", 4, "TREE", "LL", 0, 0], ["AllReduce", 4, "RING", "SIMPLE", 0, 0]]
    assert t["algo_id"].isna().all()  # names, not ids, from 2.24
    assert log.env_values("NCCL_ALGO") == ["Ring"]
    assert log.env_values("NCCL_PROTO") == ["Simple"]
    assert log.env_values("NCCL_IB_TC") == ["106"]
    assert log.env_values("NCCL_SOCKET_IFNAME") == ["enp25s0np0"]
    assert log.env_values("NCCL_NET_GDR_LEVEL") == ["PIX"]
    assert log.env_values("NCCL_IB_DISABLE") == ["0"]
    assert "NCCL_IB_HCA" not in set(log.env["name"])  # "NCCL_IB_HCA set to ..." is no echo
    m = log.enabled.set_index("func")
    assert list(m.index) == ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]
    assert m.loc["AllReduce", ["LL", "LL128", "Simple", "Tree", "Ring", "NVLS", "PAT"]].tolist() == [
        0, 0, 1, 0, 1, 0, 0]
    assert len(log.init) == 7
    assert set(log.init["init_func"]) == {"ncclCommInitRank"}
    assert log.init.set_index("comm").loc["0x559a0bcabd20", "rank"] == 12
    assert log.coll["nranks"].eq(16).all() and len(log.coll) == 16
    assert log.nranks == 16
    assert set(log.coll_channels) == {4}


def test_nccl_2_5_6_legacy_banner_behind_mpirun_prefix():
    log = parse(_text("nccl-2.5.6-legacy-ring-tree-socket.log"))
    assert (log.library, log.version, log.version_suffix) == ("NCCL", "2.5.6", "+cuda10.2")
    assert log.env.empty  # 2.5-2.6 apply NCCL_ALGO/PROTO silently
    assert log.tuning.empty and log.networks == ()


def test_rccl_2_10_3_banner_init_with_used_bytes():
    log = parse(_text("rccl-2.10.3-mi250x-2node-socket-init.log"))
    assert (log.library, log.version, log.version_suffix) == ("RCCL", "2.10.3", "+hip5.0")
    assert log.networks == ("Socket",)
    assert log.init[["rank", "nranks", "bus_id", "used_bytes"]].values.tolist() == [
        [1, 2, "c1000", 27440], [0, 2, "c1000", 27440]]
    assert log.nranks == 2
    assert log.coll_channels == (4, 4)


def test_rccl_2_20_5_banner_with_head_and_env_echoes():
    log = parse(_text("rccl-2.20.5-lumi-env-socket.log"))
    assert (log.library, log.version, log.version_suffix) == ("RCCL", "2.20.5", "+hip6.2")
    assert log.env.values.tolist() == [  # the interface is echoed again by the init thread
        ["NCCL_SOCKET_IFNAME", "hsn"], ["RCCL_MSCCL_ENABLE", "1"], ["NCCL_SOCKET_IFNAME", "hsn"]]
    assert log.networks == ("Socket",)


_TUNING = "h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..3}"
_ENV = "h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL128"
_INIT = ("h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xabc rank 1 nranks 2 cudaDev 1 nvmlDev 1 "
         "busId 1b000 commId 0x12 - Init COMPLETE")
_COLL = ("h:1:1 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x1 recvbuff 0x2 count 262144 datatype 7 "
         "op 0 root 0 comm 0xabc [nranks=2] stream 0x3")


@pytest.mark.parametrize("prefix", ["", "[1,0]<stdout>:", "[0] ", "12: ",
                                    "[0]     64.18    0.00    0.00      0"])
def test_every_line_form_parses_behind_any_prefix(prefix):
    text = "\n".join(prefix + line for line in (_TUNING, _ENV, _INIT, _COLL, "NCCL version 2.21.5+cuda12.4"))
    log = parse(text)
    assert log.tuning[["func", "nbytes", "algo", "proto", "channel_hi"]].values.tolist() == [
        ["AllReduce", 1048576, "RING", "LL128", 3]]
    assert log.env_values("NCCL_PROTO") == ["LL128"]
    assert log.init[["init_func", "rank", "nranks", "bus_id"]].values.tolist() == [
        ["ncclCommInitRankConfig", 1, 2, "1b000"]]
    assert log.coll[["op_count", "count", "nranks"]].values.tolist() == [[31, 262144, 2]]
    assert log.version == "2.21.5"


def test_knob_check_default_run_shows_forced_settings_not_honoured():
    ex = _excerpts(_V2275)
    check = knob_check(ex["A"] + ex["B"], {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
                       func="AllReduce", nbytes=4).set_index("knob")
    assert check.loc["NCCL_ALGO", "verdict"] == "not_honoured"
    assert check.loc["NCCL_ALGO", "observed"] == "TREE"
    assert check.loc["NCCL_PROTO", "verdict"] == "not_honoured"
    assert check.loc["NCCL_PROTO", "observed"] == "LL"
    assert summarize_check(check.reset_index()) == "not_honoured"


def test_knob_check_ring_simple_run_is_honoured_by_tuning_lines():
    ex = _excerpts(_V2275)
    check = knob_check(ex["C"], {"NCCL_ALGO": "Ring", "NCCL_PROTO": "simple"},
                       func="AllReduce", nbytes=4, env_text=ex["D"])
    assert check["verdict"].tolist() == ["honoured", "honoured"]
    assert check["observed"].tolist() == ["RING", "SIMPLE"]
    assert check["echoed"].tolist() == ["Ring", "Simple"]
    assert summarize_check(check) == "honoured"
    assert observed(ex["C"], "algo", func="AllReduce", nbytes=4) == "RING"
    assert observed(ex["C"], "algo", func="AllGather") is None


def test_knob_check_falls_back_to_the_enabled_matrix():
    ex = _excerpts(_V2275)  # excerpt D: matrix, no TUNING line
    honoured = knob_check(ex["D"], {"NCCL_ALGO": "Ring"}, func="AllReduce")
    assert honoured["verdict"].tolist() == ["honoured"]
    assert "matrix" in honoured["reason"].iloc[0]
    # Against the matrix alone (no echo to contradict), a Tree request shows not honoured.
    tree = knob_check(ex["D"], {"NCCL_ALGO": "Tree"}, func="AllReduce", env_text="")
    assert tree["verdict"].tolist() == ["not_honoured"]
    # With the echo, the mismatch between requested and seen env decides first.
    echo = knob_check(ex["D"], {"NCCL_ALGO": "Tree"}, func="AllReduce")
    assert echo["verdict"].tolist() == ["not_honoured"] and "NCCL saw" in echo["reason"].iloc[0]


def test_knob_check_per_size_on_numeric_2_22_lines():
    text = _text("nccl-2.22.3-h100-24rank-tuning-numeric-nvls.log")
    assert knob_check(text, {"NCCL_ALGO": "Tree"}, func="AllReduce", nbytes=262144)["verdict"].tolist() == ["honoured"]
    big = knob_check(text, {"NCCL_ALGO": "Tree"}, func="AllReduce", nbytes=524288)
    assert big["verdict"].tolist() == ["not_honoured"] and big["observed"].tolist() == ["NVLS_TREE"]
    # An exclusion list and the 2.24 per-function form read the same way.
    assert knob_check(text, {"NCCL_ALGO": "^NVLSTree"}, nbytes=8)["verdict"].tolist() == ["honoured"]
    assert knob_check(text, {"NCCL_ALGO": "^NVLSTree"}, nbytes=524288)["verdict"].tolist() == ["not_honoured"]
    per_func = {"NCCL_ALGO": "allgather:ring;allreduce:tree,nvlstree"}
    assert knob_check(text, per_func, func="AllReduce")["verdict"].tolist() == ["honoured"]
    assert knob_check(text, {"NCCL_PROTO": "LL,LL128"}, nbytes=524288)["verdict"].tolist() == ["not_honoured"]


def test_knob_check_unverifiable_cases_and_other_knobs():
    old = _text("nccl-2.18-h800-env-algo-list-init.log")
    listed = "Tree,Ring,,CollnetDirect,CollnetChain,NVLS"
    check = knob_check(old, {"NCCL_ALGO": listed, "GLOO_SOCKET_IFNAME": "lo",
                             "NCCL_MIN_NCHANNELS": "16", "NCCL_MAX_NCHANNELS": "8"}).set_index("knob")
    assert check.loc["NCCL_ALGO", "verdict"] == "unverifiable"  # echoed, but no TUNING line
    assert check.loc["NCCL_ALGO", "echoed"] == listed
    assert check.loc["GLOO_SOCKET_IFNAME", "verdict"] == "unverifiable"
    assert check.loc["NCCL_MIN_NCHANNELS", "verdict"] == "honoured"  # 16 coll channels
    assert check.loc["NCCL_MAX_NCHANNELS", "verdict"] == "not_honoured"
    assert summarize_check(check.reset_index()) == "not_honoured"
    ib = knob_check(_text("nccl-2.12.12-ib-disable-socket-init.log"),
                    {"NCCL_IB_DISABLE": "1", "NCCL_BUFFSIZE": "4194304", "NCCL_DEBUG": "INFO"})
    assert ib.set_index("knob")["verdict"].to_dict() == {
        "NCCL_BUFFSIZE": "unverifiable", "NCCL_IB_DISABLE": "honoured"}
    assert summarize_check(ib) == "unverifiable"
    assert summarize_check(knob_check("", {})) == "none_forced"
    rccl = knob_check(_text("rccl-2.20.5-lumi-env-socket.log"), {"NCCL_SOCKET_IFNAME": "eth0"})
    assert rccl["verdict"].tolist() == ["not_honoured"]  # the process saw "hsn"


def test_knob_check_point_to_point_calls_are_unverifiable_for_algo():
    ex = _excerpts(_V2275)
    check = knob_check(ex["C"], {"NCCL_ALGO": "Ring"}, nbytes=4, point_to_point=True)
    assert check["verdict"].tolist() == ["unverifiable"]
