"""Energy of serving: joules per request and per output token from each GPU's busy and idle time.

A serving run (the simulator or the engine, :mod:`hetplan.serve`) knows, for every GPU, how long it computed
prefills, how long it computed decode steps and how long it waited (no batch to run, or blocked on a swap or a
peer). On the same DVFS power model as training (:mod:`hetplan.hardware.power`; Perseus' split of GPU power
into a blocking part and a computing part, Chung et al. SOSP'24 §4.1):

    E_gpu      = P_busy(f_eff) · (t_prefill + t_decode) + P_idle · t_idle
    E          = Σ_gpus E_gpu
    J/request  = E / requests,   J/output token = E / output tokens

``P_idle`` is the catalog's blocking power (:attr:`~hetplan.hardware.catalog.GPUSpec.idle_power_w`),
``P_busy(f_eff)`` the model's power at the clock the power limit sustains (the top clock unless capped).
Decode steps are memory-bound and draw less than the compute-bound ``P_busy`` (ML.ENERGY, Chung et al.
2025, "The ML.ENERGY Benchmark", arXiv:2505.06371: decode-heavy LLM serving at 50–70 % of TDP), so the decode
term is an upper bound; prefill is compute-bound and is charged exactly what a training instruction is. A GPU
without a DVFS model is charged its TDP while busy (``energy_source = "tdp"``, an upper bound too).

Per token the whole energy is charged, prefill and idle included (what ML.ENERGY's J/token reports: GPU energy
over the benchmark window divided by generated tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.power import board_limited, get_power


@dataclass(frozen=True)
class InferenceEnergy:
    """Energy of a serving run.

    Attributes:
        energy_j: all GPUs, whole run (J). prefill_energy_j, decode_energy_j, idle_energy_j: its parts (J).
        energy_j_per_request: ``energy_j / requests`` (None with no request).
        energy_j_per_output_token: ``energy_j / output tokens`` (None with no token).
        average_power_w_per_gpu: ``energy_j`` over the GPUs' summed wall time (W).
        busy_power_w, idle_power_w: the per-GPU powers used (W). energy_source: ``"dvfs-model"`` (fitted),
            ``"dvfs-physics"`` (transferred, not fitted) or ``"tdp"``.
    """

    energy_j: float
    prefill_energy_j: float
    decode_energy_j: float
    idle_energy_j: float
    energy_j_per_request: float | None
    energy_j_per_output_token: float | None
    average_power_w_per_gpu: float
    busy_power_w: float
    idle_power_w: float
    energy_source: str

    def to_dict(self) -> dict:
        """The fields above as a JSON-ready dict."""
        return asdict(self)


def _seconds(value: float | Sequence[float], name: str, n: int | None) -> np.ndarray:
    a = np.atleast_1d(np.asarray(value, dtype=float))
    if a.ndim != 1 or (n is not None and a.size not in (1, n)):
        raise HetplanError(f"{name} must be one number or one per GPU ({n}), got shape {a.shape}", field=name,
                           fix="give seconds per GPU, in the same order for every time")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise HetplanError(f"{name} must be finite seconds ≥ 0, got {value}", field=name,
                           fix="give the busy/idle time of each GPU in seconds")
    return a


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise HetplanError(f"{name} must be an integer ≥ 0, got {value}", field=name,
                           fix="count the finished requests and their generated tokens")
    return int(value)


def busy_idle_power_w(gpu: str, catalog: Catalog | None = None, power_catalog: str | None = None,
                      ) -> tuple[float, float, str]:
    """``(P_busy at the sustained top clock, P_idle, energy_source)`` of catalog GPU ``gpu`` (W, W, str)."""
    catalog = catalog or load_catalog()
    spec = catalog.get(gpu)
    try:
        pw = get_power(spec.name, power_catalog, field="gpu")
    except HetplanError:
        return float(spec.tdp_w), float(spec.idle_power_w), "tdp"
    pw = board_limited(pw, spec.tdp_w, spec.idle_power_w)  # the default limit: idle ≤ P ≤ TDP
    f = pw.effective_frequency_mhz(pw.max_frequency_mhz, spec.idle_power_w)
    source = "dvfs-model" if pw.fitted else "dvfs-physics"  # fitted, or transferred (gpu_power.toml)
    return float(pw.busy_power_w(f, spec.idle_power_w)), float(spec.idle_power_w), source


def inference_energy(gpu: str, *, prefill_busy_s: float | Sequence[float], decode_busy_s: float | Sequence[float],
                     idle_s: float | Sequence[float], num_gpus: int | None = None, num_requests: int = 0,
                     output_tokens: int = 0, catalog: Catalog | None = None,
                     power_catalog: str | None = None) -> InferenceEnergy:
    """Energy of a serving run on GPUs of type ``gpu`` (module doc).

    Args:
        gpu: catalog GPU name or alias.
        prefill_busy_s, decode_busy_s, idle_s: seconds per GPU (one number each: the same on every GPU, then
            ``num_gpus`` says how many), ≥ 0.
        num_gpus: GPUs when the times are single numbers (default: the length of the per-GPU times, else 1).
        num_requests, output_tokens: finished requests and the tokens they generated, ≥ 0.
        catalog: GPU catalog (default: the package's). power_catalog: user DVFS TOML.

    Raises:
        HetplanError: unknown GPU, negative or non-finite times, mismatched per-GPU lengths, bad counts.
    """
    sizes = {np.size(x) for x in (prefill_busy_s, decode_busy_s, idle_s)} - {1}
    if len(sizes) > 1:
        raise HetplanError(f"per-GPU times have different lengths {sorted(sizes)}", field="idle_s",
                           fix="give prefill, decode and idle seconds for the same GPUs")
    n = sizes.pop() if sizes else None
    if n == 0:
        raise HetplanError("per-GPU times are empty", field="prefill_busy_s", fix="give at least one GPU's times")
    if num_gpus is not None:
        if isinstance(num_gpus, bool) or int(num_gpus) != num_gpus or num_gpus < 1 or (n is not None and n != num_gpus):
            raise HetplanError(f"num_gpus must be a positive integer matching the per-GPU times, got {num_gpus}",
                               field="num_gpus", fix="give the number of GPUs the times are for")
        n = int(num_gpus)
    n = n or 1
    pre = _seconds(prefill_busy_s, "prefill_busy_s", n)
    dec = _seconds(decode_busy_s, "decode_busy_s", n)
    idle = _seconds(idle_s, "idle_s", n)
    requests, tokens = _count(num_requests, "num_requests"), _count(output_tokens, "output_tokens")
    p_busy, p_idle, source = busy_idle_power_w(gpu, catalog, power_catalog)
    pre, dec, idle = (np.broadcast_to(x, (n,)) for x in (pre, dec, idle))  # one number: every GPU
    e_pre, e_dec, e_idle = p_busy * float(pre.sum()), p_busy * float(dec.sum()), p_idle * float(idle.sum())
    wall = float((pre + dec + idle).sum())
    total = e_pre + e_dec + e_idle
    return InferenceEnergy(
        energy_j=total, prefill_energy_j=e_pre, decode_energy_j=e_dec, idle_energy_j=e_idle,
        energy_j_per_request=total / requests if requests else None,
        energy_j_per_output_token=total / tokens if tokens else None,
        average_power_w_per_gpu=total / wall if wall > 0 else math.nan,
        busy_power_w=p_busy, idle_power_w=p_idle, energy_source=source)
