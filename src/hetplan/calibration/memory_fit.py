"""A stack's memory residual, fitted on the stack's own measured memory (``python -m hetplan.calibration.memory_fit``).

What ``nvidia-smi`` shows per GPU is the estimate's footprint (:attr:`hetplan.estimate.memory.StageMemory.total`:
the allocated peak, the CUDA context, the allocator's cache) plus what the model does not hold: NCCL's buffers,
one set per communicator (``NCCL_BUFFSIZE`` 4 MiB for the Simple protocol plus LL / LL128 buffers, per channel and
peer: NVIDIA/nccl issues 864 and 986, 0.3-1.6 GB per communicator), and the cache a stack's allocation pattern
strands. Their size depends on the NCCL release, its channels and algorithms and on how many communicators the
stack opens, so it is not priced from first principles: where a stack's public runs report ``nvidia-smi`` memory,
the median excess over the footprint on a seeded fraction of its rows (:data:`FIT_FRACTION`, the hash of the row
key with :data:`hetplan.calibration.validation.CALIBRATION_SEED`) is the stack's
:attr:`~hetplan.hardware.stacks.StackSpec.memory_residual_gib`, and the rest are held out.

Today one stack has such rows: ``megatron-deepspeed@2022-02``, BLOOM's layout search on Jean Zay
(``bigscience_a100``, 92 rows with memory): DeepSpeed's pipeline engine opens a communicator per pipeline pair,
per tied-weight group, and for its data, model and tensor-parallel groups (``deepspeed/runtime/pipe/topology.py``
``PipelineParallelGrid``), and its measured out-of-memory layouts (:func:`hetplan.calibration.modern.bigscience.
oom_check`) ran out at allocated peaks well below 80 GiB. The value enters ``stacks.toml`` by hand, in a reviewed
commit, with this provenance; nothing mutates module state.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hetplan.calibration.modern.mapping import CALIBRATION_FRACTION

#: Seeded fraction of the stack's memory rows fitted on (the modern sets' split: the rest held out).
FIT_FRACTION = CALIBRATION_FRACTION


@dataclass(frozen=True)
class MemoryResidualFit:
    """The fitted residual (GiB) and the memory error before and after it, on fitted and held-out rows.

    Attributes:
        stack: the stack id; residual_gib: the fitted value; n_fit, n_held_out: rows.
        held_out_mape_before, held_out_mape_after: mean |predicted / measured - 1| of the held-out rows without
            and with the residual; held_out_signed_before / _after: their median signed error.
    """

    stack: str
    residual_gib: float
    n_fit: int
    n_held_out: int
    held_out_mape_before: float
    held_out_mape_after: float
    held_out_signed_before: float
    held_out_signed_after: float


def fit_bigscience(catalog=None) -> MemoryResidualFit:
    """Fit ``megatron-deepspeed@2022-02``'s residual on the seeded fraction of ``bigscience_a100``'s memory rows:
    the median of measured minus predicted (the footprint without the residual), rounded to 0.1 GiB."""
    from hetplan.calibration.modern import bigscience
    from hetplan.hardware.stacks import resolve_stack

    stack = resolve_stack(bigscience.STACK)
    current = stack.memory_residual_gib * 2**30
    cases, _ = bigscience.bigscience_cases(catalog)
    rows = []
    for c in cases:
        if not c.measured_memory_bytes:
            continue
        c.evaluate(catalog)
        rows.append((c.is_calibration, c.measured_memory_bytes, c.predicted_memory_bytes - current))
    fit = [m - p for cal, m, p in rows if cal]
    residual = round(statistics.median(fit) / 2**30, 1)
    held = [(m, p) for cal, m, p in rows if not cal]

    def errors(add: float) -> list[float]:
        return [(p + add) / m - 1 for m, p in held]

    before, after = errors(0.0), errors(residual * 2**30)
    return MemoryResidualFit(stack.id, residual, len(fit), len(held),
                             statistics.mean(abs(e) for e in before), statistics.mean(abs(e) for e in after),
                             statistics.median(before), statistics.median(after))


if __name__ == "__main__":
    print(fit_bigscience())
