"""Parse ``NCCL_DEBUG=INFO`` output (NCCL and RCCL) and check that forced knobs were honoured.

Formats and their version history are in ``shared/reference/nccl-logs/README.md``. Every pattern
is searched without anchoring to the line start: lines arrive wrapped in launcher prefixes
(``[1,0]<stdout>:``, ``[0] ``, ``N: ``) or glued after other output on the same line.

:func:`parse` returns a :class:`NcclLog` of DataFrames; :func:`knob_check` says, for each knob
the user forced, whether the log shows it ``honoured``, ``not_honoured`` or ``unverifiable``.
Setting a variable is not proof it took effect: NCCL silently ignores an algorithm it cannot run
(NVLS without NVSwitch, CollNet without SHARP), so NCCL_ALGO/NCCL_PROTO are judged by the TUNING
lines (what was chosen per call) or, failing those, by the 2.24+ Enabled matrix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where rows are built: a rank never pays for it
    import pandas as pd


__all__ = ["NcclLog", "parse", "knob_check", "summarize_check", "observed", "ALGO_IDS", "PROTO_IDS",
           "HONOURED", "NOT_HONOURED", "UNVERIFIABLE"]

HONOURED, NOT_HONOURED, UNVERIFIABLE = "honoured", "not_honoured", "unverifiable"

#: Numeric ids of the 2.20-2.23 TUNING lines (src/include/devcomm.h); PAT from 2.23.
ALGO_IDS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS",
            5: "NVLS_TREE", 6: "PAT"}
PROTO_IDS = {0: "LL", 1: "LL128", 2: "SIMPLE"}
_ALGOS = tuple(ALGO_IDS.values())
_PROTOS = tuple(PROTO_IDS.values())
# Env values and matrix headers spell names in mixed case without underscores
# (Ring, CollnetDirect, CollNetChain, NVLSTree); TUNING lines in upper case with them.
_ALGO_KEYS = {a.replace("_", ""): (a,) for a in _ALGOS} | {"COLLNET": ("COLLNET_DIRECT", "COLLNET_CHAIN")}
_PROTO_KEYS = {p: (p,) for p in _PROTOS}

_BANNER = re.compile(r"(?<![A-Za-z])(NCCL|RCCL) version (\d+\.\d+\.\d+)(\S*)")
_ENV = re.compile(r"NCCL INFO ([A-Z][A-Z0-9_]*) set by environment to (.*?)\.?\s*$")
_TUNING = re.compile(
    r"NCCL INFO (?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)"
    r"(?: time ([\d.]+))?(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?"
)
_COLL = re.compile(
    r"(\w+): opCount ([0-9a-f]+) sendbuff (\S+) recvbuff (\S+) count (\d+) datatype (\d+) "
    r"op (\d+) root (\d+) comm (0x[0-9a-f]+) \[nranks=(\d+)\] stream (\S+)"
)
_INIT = re.compile(
    r"(?:(ncclComm\w+) )?comm (0x[0-9a-f]+) rank (\d+) nranks (\d+) cudaDev (\d+)"
    r"(?: nvmlDev (\d+))? busId ([0-9a-f]+)(?:.*?used (\d+) bytes)?.*- Init COMPLETE"
)
_NRANKS = re.compile(r"\bnRanks (\d+)")
_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_COLL_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")
_MATRIX_START = re.compile(r"Enabled NCCL Func/Proto/Algo Matrix:")
_MATRIX_ROW = re.compile(r"(\w+)\s*\|\s*([\d\s]+?)\s*\|\s*([\d\s]+?)\s*$")
_MATRIX_HEADER = re.compile(r"Function\s*\|([^|]*)\|(.*)$")


@dataclass(kw_only=True, frozen=True)
class NcclLog:
    """What one NCCL/RCCL debug log says (any number of ranks, any prefixes)."""

    library: str | None
    """``NCCL`` or ``RCCL`` from the version banner; None when no banner was printed."""
    version: str | None
    """``major.minor.patch`` from the banner, e.g. ``2.12.12``; None without a banner."""
    version_suffix: str | None
    """What follows the version on the banner token (``+cuda11.7``, ``+hip6.2``)."""
    env: pd.DataFrame
    """Env echoes: columns name, value (integer params without their trailing '.')."""
    tuning: pd.DataFrame
    """Algorithm/protocol choices: func (None before 2.23), nbytes, algo, proto (names, numeric
    ids mapped), algo_id/proto_id (when printed as numbers), time_us, channel_lo, channel_hi."""
    coll: pd.DataFrame
    """COLL lines: func, op_count (int, from hex), count, datatype, op, root, comm, nranks,
    sendbuff, recvbuff, stream."""
    init: pd.DataFrame
    """Init COMPLETE lines: init_func, comm, rank, nranks, cuda_dev, nvml_dev, bus_id, used_bytes."""
    enabled: pd.DataFrame
    """2.24+ Enabled Func/Proto/Algo matrix: one row per function, one column per proto/algo
    (0/1; 2 for LL128 left on auto)."""
    networks: tuple[str, ...]
    """Distinct ``Using network X`` values, in order (``Socket``, ``IB``)."""
    coll_channels: tuple[int, ...]
    """Every ``N coll channels`` value printed."""
    nranks: int | None
    """Communicator size from init, COLL or ``nRanks`` lines (the largest seen); None if absent."""

    def env_values(self, name: str) -> list[str]:
        """Distinct values echoed for ``name``, in order of appearance."""
        return list(dict.fromkeys(self.env.loc[self.env["name"] == name, "value"]))


def _name(token: str, ids: dict[int, str]) -> tuple[str, int | None]:
    if token.isdigit():
        return ids.get(int(token), f"UNKNOWN_{token}"), int(token)
    return token.upper(), None


def _matrix(lines: list[str], start: int) -> list[dict]:
    header = None
    rows = []
    for line in lines[start + 1:]:
        h = _MATRIX_HEADER.search(line)
        if h and header is None:
            header = h[1].split() + h[2].split()
            continue
        m = _MATRIX_ROW.search(line)
        if header is None or not m or m[1] == "Function":
            break
        values = [int(v) for v in (m[2].split() + m[3].split())]
        if len(values) != len(header):
            break
        rows.append({"func": m[1], **dict(zip(header, values))})
    return rows


def parse(text: str) -> NcclLog:
    """Parse NCCL_DEBUG=INFO text (one rank's log or several concatenated)."""
    import pandas as pd
    lines = text.splitlines()
    banner = _BANNER.search(text)
    env, tuning, coll, init, enabled, networks, channels, nranks = [], [], [], [], [], [], [], []
    for i, line in enumerate(lines):
        if "NCCL INFO" not in line and "Matrix" not in line:
            continue
        if m := _ENV.search(line):
            env.append({"name": m[1], "value": m[2]})
        elif m := _TUNING.search(line):
            algo, algo_id = _name(m[3], ALGO_IDS)
            proto, proto_id = _name(m[4], PROTO_IDS)
            tuning.append({
                "func": m[1], "nbytes": int(m[2]), "algo": algo, "proto": proto,
                "algo_id": algo_id, "proto_id": proto_id,
                "time_us": float(m[5]) if m[5] else None,
                "channel_lo": int(m[6]) if m[6] else None, "channel_hi": int(m[7]) if m[7] else None,
            })
        elif m := _COLL.search(line):
            coll.append({
                "func": m[1], "op_count": int(m[2], 16), "sendbuff": m[3], "recvbuff": m[4],
                "count": int(m[5]), "datatype": int(m[6]), "op": int(m[7]), "root": int(m[8]),
                "comm": m[9], "nranks": int(m[10]), "stream": m[11],
            })
            nranks.append(int(m[10]))
        elif m := _INIT.search(line):
            init.append({
                "init_func": m[1], "comm": m[2], "rank": int(m[3]), "nranks": int(m[4]),
                "cuda_dev": int(m[5]), "nvml_dev": int(m[6]) if m[6] else None, "bus_id": m[7],
                "used_bytes": int(m[8]) if m[8] else None,
            })
            nranks.append(int(m[4]))
        elif _MATRIX_START.search(line):
            enabled.extend(_matrix(lines, i))
        else:
            if m := _NETWORK.search(line):
                networks.append(m[1])
            if m := _COLL_CHANNELS.search(line):
                channels.append(int(m[1]))
            if m := _NRANKS.search(line):
                nranks.append(int(m[1]))
    columns = {
        "env": ["name", "value"],
        "tuning": ["func", "nbytes", "algo", "proto", "algo_id", "proto_id", "time_us",
                   "channel_lo", "channel_hi"],
        "coll": ["func", "op_count", "sendbuff", "recvbuff", "count", "datatype", "op", "root",
                 "comm", "nranks", "stream"],
        "init": ["init_func", "comm", "rank", "nranks", "cuda_dev", "nvml_dev", "bus_id", "used_bytes"],
    }
    frames = {k: pd.DataFrame(v, columns=columns[k]) for k, v in
              {"env": env, "tuning": tuning, "coll": coll, "init": init}.items()}
    return NcclLog(
        library=banner[1] if banner else None, version=banner[2] if banner else None,
        version_suffix=banner[3] if banner else None, enabled=pd.DataFrame(enabled),
        networks=tuple(dict.fromkeys(networks)), coll_channels=tuple(channels),
        nranks=max(nranks) if nranks else None, **frames,
    )


def _allowed(requested: str, func: str, keys: dict[str, tuple[str, ...]]) -> set[str] | None:
    """Names NCCL may use for ``func`` under NCCL_ALGO/NCCL_PROTO = ``requested``: a comma list,
    ``^`` excluding, or 2.24+ per-function ``allreduce:tree;broadcast:ring``. None: no rule for
    ``func`` (or unparseable)."""
    everything = {n for names in keys.values() for n in names}
    rule = None
    for segment in requested.split(";"):
        name, sep, value = segment.rpartition(":")
        if sep and name.strip().lower() not in ("", func.lower()):
            continue  # a rule for another function
        value = value.strip()
        exclude = value.startswith("^")
        names = set()
        for item in value.lstrip("^").split(","):
            key = item.strip().upper().replace("_", "")
            if not key:
                continue  # "Tree,Ring,,CollnetDirect": NCCL skips empty elements too
            if key not in keys:
                return None
            names.update(keys[key])
        rule = everything - names if exclude else names
    return rule


def _records(log: NcclLog, func: str | None, nbytes: int | None) -> pd.DataFrame:
    t = log.tuning
    if func:  # lines without a function name (2.20-2.22) cannot be told apart: keep them
        t = t[t["func"].isna() | (t["func"].str.lower() == func.lower())]
    if nbytes is not None:
        t = t[t["nbytes"] == nbytes]
    return t


def observed(log_text: str | NcclLog, what: str, *, func: str | None = None,
             nbytes: int | None = None) -> str | None:
    """Comma list of the distinct algorithms (``what="algo"``) or protocols (``"proto"``) the
    TUNING lines show for ``func``/``nbytes``; None when there are no such lines."""
    log = log_text if isinstance(log_text, NcclLog) else parse(log_text)
    values = sorted(set(_records(log, func, nbytes)[what]))
    return ",".join(values) if values else None


def _check_choice(knob, requested, log, func, nbytes, what, keys) -> tuple[str, str, str | None]:
    allowed = _allowed(requested, func or "", keys)
    if allowed is None:
        return UNVERIFIABLE, f"cannot read {knob}={requested!r} for {func or 'this op'}", None
    records = _records(log, func, nbytes)
    if len(records):
        seen = set(records[what])
        bad = sorted(seen - allowed)
        verdict = NOT_HONOURED if bad else HONOURED
        reason = (f"TUNING lines show {','.join(bad)} outside {','.join(sorted(allowed))}" if bad
                  else f"every TUNING line shows {','.join(sorted(seen))}")
        return verdict, reason, ",".join(sorted(seen))
    if func and len(log.enabled) and (log.enabled["func"].str.lower() == func.lower()).any():
        row = log.enabled[log.enabled["func"].str.lower() == func.lower()].iloc[0]
        on = set()
        for column, value in row.drop("func").items():
            names = keys.get(str(column).upper().replace("_", ""), ())
            if value:
                on.update(names)
        bad = sorted(on - allowed)
        reason = (f"Enabled matrix enables {','.join(bad)}" if bad
                  else f"Enabled matrix enables only {','.join(sorted(on))}")
        return (NOT_HONOURED if bad else HONOURED), reason, ",".join(sorted(on))
    return UNVERIFIABLE, ("no TUNING line for this call (needs NCCL_DEBUG_SUBSYS=TUNING, NCCL >= "
                          "2.20; point-to-point ops print none)"), None


def _check_channels(knob, requested, log) -> tuple[str, str, str | None]:
    if not log.coll_channels or not requested.strip().isdigit():
        return UNVERIFIABLE, "no 'coll channels' line to compare with", None
    k = int(requested)
    seen = sorted(set(log.coll_channels))
    ok = all(c >= k for c in seen) if "MIN" in knob else all(c <= k for c in seen)
    return (HONOURED if ok else NOT_HONOURED), f"coll channels {seen} vs {knob}={k}", ",".join(map(str, seen))


def _same(knob: str, echoed: str, requested: str) -> bool:
    if knob in ("NCCL_ALGO", "NCCL_PROTO"):  # NCCL reads these case-insensitively
        return echoed.strip().lower() == requested.strip().lower()
    return echoed.strip() == requested.strip()


def knob_check(log_text: str | NcclLog, requested_env: Mapping[str, str], *, func: str | None = None,
               nbytes: int | None = None, env_text: str | NcclLog | None = None,
               point_to_point: bool = False) -> pd.DataFrame:
    """For each forced knob in ``requested_env``: was it honoured according to the log?

    ``log_text`` (text or a parsed :class:`NcclLog`) holds the TUNING lines (rank 0's log); ``func`` (``AllReduce``...) and
    ``nbytes`` (NCCL's nBytes: S of formulas.md) narrow them to one benchmark point.
    ``env_text`` (default ``log_text``) is searched for env echoes, e.g. every rank's log.
    ``point_to_point``: the call was a send/recv (all_to_all too), which NCCL runs without an
    algorithm choice, so NCCL_ALGO/NCCL_PROTO cannot be checked against it.
    Columns: knob, requested, echoed (the value NCCL echoed, or None), observed, verdict
    (``honoured``/``not_honoured``/``unverifiable``), reason.
    """
    import pandas as pd
    log = log_text if isinstance(log_text, NcclLog) else parse(log_text)
    if env_text is None:
        echoes = log
    else:
        echoes = env_text if isinstance(env_text, NcclLog) else parse(env_text)
    rows = []
    for knob, requested in sorted(requested_env.items()):
        if knob.startswith("NCCL_DEBUG"):
            continue  # our own instrumentation, not a knob under test
        echoed_values = echoes.env_values(knob)
        echoed = echoed_values[-1] if echoed_values else None
        observed_value = None
        if not knob.startswith(("NCCL_", "RCCL_")):
            verdict, reason = UNVERIFIABLE, "not an NCCL variable; NCCL logs say nothing of it"
        elif echoed_values and any(not _same(knob, v, requested) for v in echoed_values):
            verdict, reason = NOT_HONOURED, f"NCCL saw {knob}={'|'.join(echoed_values)}"
        elif knob in ("NCCL_ALGO", "NCCL_PROTO") and point_to_point:
            verdict, reason = UNVERIFIABLE, "point-to-point calls make no algo/proto choice in the log"
        elif knob == "NCCL_ALGO":
            verdict, reason, observed_value = _check_choice(knob, requested, log, func, nbytes, "algo", _ALGO_KEYS)
        elif knob == "NCCL_PROTO":
            verdict, reason, observed_value = _check_choice(knob, requested, log, func, nbytes, "proto", _PROTO_KEYS)
        elif knob in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
            verdict, reason, observed_value = _check_channels(knob, requested, log)
        elif echoed is not None:
            verdict, reason = HONOURED, "echoed by NCCL with the requested value"
        else:
            verdict, reason = UNVERIFIABLE, "not echoed (needs NCCL_DEBUG_SUBSYS=ENV; NCCL >= 2.7)"
        rows.append({"knob": knob, "requested": requested, "echoed": echoed,
                     "observed": observed_value, "verdict": verdict, "reason": reason})
    return pd.DataFrame(rows, columns=["knob", "requested", "echoed", "observed", "verdict", "reason"])


def summarize_check(check: pd.DataFrame) -> str:
    """One word for a row: ``none_forced``, ``not_honoured`` (any knob), ``honoured`` (all
    knobs) or ``unverifiable`` (some knob could not be checked)."""
    if check.empty:
        return "none_forced"
    verdicts = set(check["verdict"])
    if NOT_HONOURED in verdicts:
        return NOT_HONOURED
    return HONOURED if verdicts == {HONOURED} else UNVERIFIABLE
