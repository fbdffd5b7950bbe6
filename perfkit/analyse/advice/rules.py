"""perfkit's built-in advice rules, as data (:mod:`perfkit.analyse.advice.findings` runs and ranks them): each
rule's threshold and source here, its function in :mod:`.training`, :mod:`.kernels`,
:mod:`.compute` or :mod:`.inference`.

Each rule reads columns that perfkit's notebooks record, compares one number with its threshold,
and says where the threshold comes from. A rule finds nothing where its columns are absent: no
finding is ever made of evidence that is not in the rows.

=========================  ==================================================  =====================
rule                       evidence (columns)                                  threshold, source
=========================  ==================================================  =====================
input_bound                dataloader: data_wait_share (median of per-step     5 % of the step:
                           shares), prep/fetch stalls; train_step: per-step     tb_plugin's
                           data_time / (data_time + step_time), where it       ``dataloader_ratio``
                           measured an input pipeline (data_source: not
                           perfkit's own synthetic batch)
straggler                  scaling: rank_compute_time_s (analyse.scaling's     10 % of the step:
                           step_breakdown: slowest rank vs the others)         the noisy flag's bound
exposed_communication      scaling: step_time_s - compute_time_s - straggler   10 % of the step
pipeline_bubble            train_step: bubble_fraction(_predicted),            m >= 4 p: GPipe
                           n_microbatches, pp_stages                           (Huang et al. 2019)
collectives_latency_bound  collectives: alpha through the smallest and         alpha >= 1/2 of the
                           largest size's fastest samples (and commfit's fit)  largest size's time
memory_headroom            train_step: max_batch_size_predicted (the fake-     edge >= 2 x batch
                           tensor step's, else the memory model's, against     (with activation
                           memory_budget_bytes) over batch_size; near the      checkpointing too)
                           edge, max_batch_size_predicted_checkpointed
gemm_below_ceiling         gemm: flop_per_s against its own device's roof of   50 % of the ceiling
                           the dtype (measured, else spec; origin named), or
                           the device's best GEMM of the dtype
host_bound                 any profiled row: trace_idle_share (HTA's idle      device idle >= 50 %:
                           time over the trace's window), short kernels        tb_plugin's low GPU
                                                                               utilization (< 0.5)
launch_bound_generation    inference: decode_percent_of_roof and tpot_s at     under 10 % of the roof
                           the smallest batch (roof time = tpot x fraction),   and under 1 ms of roof
                           the prefill's beside it                             time (gpt-fast, 2023)
memory_bound_ops           roofline: time_share of the ops whose bound is a    >= 50 % of the step
                           memory level
precision_below_device     roofline: time_share of compute-bound ops at fp32,  faster roof >= 2 x
                           tf32 or bf16; the compute roofs by dtype            the current one
precision_slower           train_step: step_time_s of the same configuration   1.2 x slower at the
                           at two precisions; fp8_reason                       lower precision
noisy                      noisy (IQR over 10 % of the median)                 core.timing's flag
=========================  ==================================================  =====================
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.errors import BadInputError
from . import compute
from . import inference
from . import kernels
from . import training
from .. import dataloading
from .findings import Rule

__all__ = ["ENTRY_POINT_GROUP", "RULES", "all_rules", "select_rules"]

ENTRY_POINT_GROUP = "perfkit.advice_rules"
"""Where a package registers its own rules: each entry a :class:`~perfkit.analyse.advice.Rule`
or a list of them (``[project.entry-points."perfkit.advice_rules"]`` in its pyproject.toml)."""

RULES: tuple[Rule, ...] = (
    Rule("input_bound", "input-bound", dataloading.INPUT_BOUND_SHARE,
         "pytorch/kineto tb_plugin RunProfileData.analyze: DataLoader > 5 % of the step -> more workers; "
         "Mohan et al., VLDB 2021 (DS-Analyzer) for fetch vs preprocessing stalls", training.input_bound,
         "the step waits on its input"),
    Rule("straggler", "straggler", 0.10,
         "perfkit: a rank slower than the others by more than the noisy flag's 10 % spread "
         "(analyse/scaling.py step_breakdown)", training.straggler, "one rank's compute is late and every rank waits"),
    Rule("exposed_communication", "exposed communication", 0.10,
         "perfkit: step - compute-only step (gradient sync disabled), less the straggler's wait "
         "(analyse/scaling.py step_breakdown)", training.exposed_communication, "communication not hidden behind compute"),
    Rule("pipeline_bubble", "pipeline bubble", 4.0,
         "Huang et al., GPipe (NeurIPS 2019): the bubble is negligible when microbatches >= 4 x stages; "
         "bubble (p-1)/(v m+p-1), Narayanan et al. SC'21", training.pipeline_bubble,
         "too few microbatches for the pipeline's depth"),
    Rule("memory_headroom", "memory headroom", 2.0,
         "the step's peak on fake tensors (measuring/training/memory_fit.py), else perfkit's memory model "
         "(measuring/training/memory_model.py: ZeRO's model-state accounting, saved activations and the "
         "backward's transient from the shapes) against the rank's budget: the batch could at least double",
         training.memory_headroom, "the batch is far below the predicted OOM edge"),
    Rule("collectives_latency_bound", "latency-bound collectives", 0.5,
         "Hockney alpha-beta model: below S_1/2 = alpha beta the per-call latency is over half the time "
         "(analyse/commfit.py)", kernels.collectives_latency_bound, "messages too small for the link's bandwidth"),
    Rule("gemm_below_ceiling", "far below the compute ceiling", 0.5,
         "roofline (Williams et al., CACM 2009): attained FLOP/s against the row's own device's compute roof "
         "of its dtype, measured where measured, else its spec sheet's (the origin is named)",
         kernels.gemm_below_ceiling, "a GEMM that reaches under half of what the device reaches"),
    Rule("host_bound", "host/launch-bound", 0.5,
         "pytorch/kineto tb_plugin RunProfileData._analyze_gpu_metrics: GPU utilization < 0.5 is low; "
         "idle time as Holistic Trace Analysis' temporal breakdown counts it (analyse/trace/breakdown.py)",
         compute.host_bound, "the device waits on the host between kernels"),
    Rule("launch_bound_generation", "launch/host-bound generation", 0.10,
         "roofline: a decode under 10 % of its roof whose roof time is under 1 ms waits on launches and "
         "Python; gpt-fast (PyTorch blog 2023, 'Accelerating Generative AI with PyTorch II'): torch.compile "
         "with a static KV cache and CUDA graphs, 25 -> 107 tokens/s on Llama-7B",
         inference.launch_bound_generation, "decode far below its roof with little work per step"),
    Rule("memory_bound_ops", "memory-bound ops", 0.5,
         "roofline (Williams et al., CACM 2009): ops under their memory roof move bytes, not FLOP; over half "
         "the step there, fusion (fewer round trips to memory) is the lever", compute.memory_bound_ops,
         "the step is mostly memory-bound ops"),
    Rule("precision_below_device", "precision the device beats", 2.0,
         "roofline: the compute roofs by dtype (measured: measuring/kernels/ceilings.py, or the spec sheet's); "
         "a roof 2x higher at tf32/bf16 than at fp32, or at fp8 than at bf16 (tensor cores, AMX)",
         compute.precision_below_device,
         "compute-bound at a precision this device runs far faster at another"),
    Rule("precision_slower", "slower at a lower precision", 1.2,
         "a lower precision is expected to be no slower; torchao's float8 training is meant to run compiled and "
         "pays only past its GEMM-size threshold (torchao.float8: _auto_filter_for_tensorwise, H100 benchmarks)",
         compute.precision_slower, "a lower precision slower than a higher one in the same configuration"),
    Rule("noisy", "noisy measurement", 0.10,
         "perfkit core/timing.py: IQR over 10 % of the median flags a point noisy (DESIGN.md)", kernels.noisy,
         "the measurement cannot tell: rerun"),
)


def all_rules() -> list[Rule]:
    """The built-in rules, then every rule a package registers under :data:`ENTRY_POINT_GROUP`."""
    from importlib.metadata import entry_points

    rules = list(RULES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        extra = loaded if isinstance(loaded, (list, tuple)) else [loaded]
        for rule in extra:
            if not isinstance(rule, Rule):
                raise BadInputError(f"entry point {ep.name!r} ({ep.value}) gives {type(rule).__name__}, "
                                    f"not a perfkit.analyse.advice.Rule")
            rules.append(rule)
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInputError(f"two advice rules are named {', '.join(twice)}: rename one (entry point group "
                            f"{ENTRY_POINT_GROUP})")
    return rules


def select_rules(names: Sequence[str] | None) -> list[Rule]:
    """The rules named (all when none): an unknown name is bad input, with the names there are."""
    rules = all_rules()
    if not names:
        return rules
    known = {r.name: r for r in rules}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadInputError(f"unknown advice rule {', '.join(map(repr, unknown))}: the rules are "
                            f"{', '.join(known)} (perfkit advise --rules)")
    return [known[n] for n in names]
