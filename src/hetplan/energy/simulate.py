"""Replay a frequency plan on the measured profile: real iteration time and energy.

Given one SM frequency per instruction, each instruction takes its *measured* time and energy at that
frequency (no quantization, no model). The iteration time is the longest path of the DAG; the energy is
computation energy plus idle power on every GPU for the time it is not computing (Perseus §4.1):
``E = Σ_v e_v + P_idle · (S · T − Σ_v t_v)``.
"""

from __future__ import annotations

import numpy as np

from hetplan.energy.dag import KIND_NAMES, PipelineDAG
from hetplan.energy.profile import StageProfile
from hetplan.errors import HetplanError


def longest_path_s(dag: PipelineDAG, duration_s: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Iteration time and per-instruction earliest finish / latest start for real durations.

    Args:
        duration_s: shape (n,), seconds.

    Returns:
        ``(T, earliest_finish, latest_start)``, seconds; shapes (n,).
    """
    n = dag.num_ops
    pairs = dag.topo_pairs if dag.narrow else None
    if pairs is not None:
        dl = np.asarray(duration_s, dtype=float).tolist()
        efl = [0.0] * (n + 1)  # efl[n] = 0: the sentinel of a missing predecessor
        for v, p, q in pairs[0]:
            a, b = efl[p], efl[q]
            efl[v] = (a if a > b else b) + dl[v]
        T = max(efl)
        lsl = [T] * (n + 1)
        for v, p, q in pairs[1]:
            a, b = lsl[p], lsl[q]
            lsl[v] = (a if a < b else b) - dl[v]
        return T, np.array(efl[:n]), np.array(lsl[:n])
    if dag.narrow:
        fwd, bwd = dag.topo_lists
        dl = np.asarray(duration_s, dtype=float).tolist()
        efl = [0.0] * n
        for v, ps in fwd:
            m = 0.0
            for p in ps:
                if efl[p] > m:  # noqa: PLR1730 - faster than max() in this hot loop
                    m = efl[p]
            efl[v] = m + dl[v]
        T = max(efl)
        lsl = [0.0] * n
        for v, ss in bwd:
            m = T
            for q in ss:
                if lsl[q] < m:  # noqa: PLR1730
                    m = lsl[q]
            lsl[v] = m - dl[v]
        return T, np.array(efl), np.array(lsl)
    pred, succ = dag.pred_matrix(), dag.succ_matrix()
    ef = np.zeros(n + 1)
    for idx in dag.levels:
        ef[idx] = ef[pred[idx]].max(axis=1) + duration_s[idx]
    T = float(ef[:n].max())
    ls = np.full(n + 1, T)
    for idx in reversed(dag.levels):
        ls[idx] = ls[succ[idx]].min(axis=1) - duration_s[idx]
    return T, ef[:n], ls[:n]


def op_time_energy(profile: StageProfile, dag: PipelineDAG, frequency_mhz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Measured (time_s, energy_j) of every instruction at its planned frequency; shapes (n,).

    Raises:
        HetplanError: a frequency was not profiled for that stage/instruction, or the plan has the wrong size.
    """
    freq = np.asarray(frequency_mhz).astype(np.int64)
    if freq.shape != (dag.num_ops,):
        raise HetplanError(f"plan has {freq.size} frequencies, the pipeline has {dag.num_ops} instructions",
                           field="frequencies_mhz", fix="give one frequency per instruction of every stage")
    t = np.empty(dag.num_ops)
    e = np.empty(dag.num_ops)
    cache: dict[tuple[int, int, int], tuple[float, float]] = {}
    for i in range(dag.num_ops):
        key = (int(dag.stage[i]), int(dag.kind[i]), int(freq[i]))
        if key not in cache:
            cache[key] = profile.get(key[0], KIND_NAMES[key[1]]).at_frequency(key[2])
        t[i], e[i] = cache[key]
    return t, e


def simulate_plan(profile: StageProfile, dag: PipelineDAG, frequency_mhz: np.ndarray,
                  idle_power_w: float) -> tuple[float, float]:
    """Real ``(iteration_time_s, iteration_energy_j)`` of a plan (one frequency per instruction, DAG order)."""
    t, e = op_time_energy(profile, dag, frequency_mhz)
    T, _, _ = longest_path_s(dag, t)
    return T, float(e.sum() + idle_power_w * (dag.num_stages * T - t.sum()))
