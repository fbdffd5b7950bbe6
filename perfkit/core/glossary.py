"""The words perfkit's outputs use, each said once: the docs' glossary is generated from this."""

from __future__ import annotations

__all__ = ["GLOSSARY"]

GLOSSARY: dict[str, str] = {
    "configuration": "one notebook with one set of parameter values: a point of a sweep's grid, or one "
                     "`perfkit run`; it runs in a fresh kernel and ends ok, failed, oom, timeout, killed or skipped",
    "row": "one record of the results table (Parquet), with its configuration's parameters, status and the "
           "fingerprint of the environment it ran in",
    "binding constraint": "of all the constraints `perfkit advise` finds in a configuration, the one that costs "
                          "the largest share of its time: what to fix first",
    "noisy": "a point whose interquartile range exceeds 10 % of its median: its median cannot be trusted alone",
    "rounds": "repeated runs of each side of an A/B sweep, interleaved (A B, B A, ...), each in a process of its "
              "own; three or more a side measure how much runs differ",
    "run-to-run spread": "how much two runs of the same build differ (σ of a run's median); `perfkit compare` "
                         "assumes 5 % where the rounds cannot measure it",
    "slot": "a place a configuration runs in: a GPU (or a set of them) on a GPU node, a share of the cores on a CPU",
    "view cells": "a notebook's cells tagged `view` (plots, tables): they run after the device is handed to the "
                  "next configuration, so plotting never holds the device",
    "prestart": "starting the next configuration's kernel, with its imports done, while the current one measures",
    "device-busy share": "the part of a sweep's wall time its devices spent measuring",
    "MFU": "model FLOP utilisation: the model's analytic FLOP per step over the step time, divided by the "
           "devices' dense peak FLOP/s of the dtype the matmuls ran in (PaLM, appendix B)",
    "roofline": "achieved FLOP/s against arithmetic intensity (FLOP per byte), under the device's roofs: "
                "attainable = min(peak, intensity × bandwidth) (Williams et al. 2009)",
    "roof share": "achieved FLOP/s over the attainable min(peak, intensity × bandwidth) of the op's dtype",
    "busbw": "bus bandwidth of a collective: algorithm bandwidth × the collective's factor (all-reduce "
             "2(n−1)/n), comparable across world sizes (nccl-tests PERFORMANCE.md)",
    "α–β model": "a collective's time as α + S/β: a per-call latency α and a bandwidth β, fitted to measured sizes",
    "S½": "the message size at which a collective reaches half its asymptotic bandwidth: α·β",
    "exposed communication": "communication time with no computation running beside it: what it adds to the step",
    "straggler": "the slowest rank of a synchronous step: every other rank waits for it in the collective",
    "pipeline bubble": "the share of a pipeline step its stages sit idle: (p − 1)/(v·m + p − 1) for p stages, "
                       "m microbatches, v stages a rank (Narayanan et al. 2021)",
    "window": "the part of a trace a figure covers: a ProfilerStep (the GPU work its host launched), all "
              "steps, or the whole trace",
    "recompute": "the forward work activation checkpointing runs again in backward",
    "DNF": "disjunctive normal form: a list of (column, op, value) tuples ANDed, a list of such lists ORed "
           "(pyarrow's `filters`)",
    "fake tensors": "tensors with shapes and dtypes and no data: `perfkit fit` runs a step on them to count its "
                    "memory without a device",
    "OOM edge": "the largest batch that fits in the device's memory",
}
