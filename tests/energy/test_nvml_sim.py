"""The simulated NVML (hetplan.energy.nvml.SimulatedNvml) behind NvmlGpu: clocks from the table, energy counter."""

from __future__ import annotations

import time

import pytest

from hetplan.energy.nvml import SIMULATED_ENV, NvmlGpu, SimulatedNvml, open_gpu
from hetplan.errors import HetplanError


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_counter_integrates_the_locked_clocks_power():
    sim = SimulatedNvml("A100-SXM-80GB")
    gpu = NvmlGpu(0, nvml=sim)
    assert gpu.simulated and gpu.supported_sm_clocks_mhz()[0] == 1410
    assert gpu.set_frequency_mhz(1005) and gpu.sm_clock_mhz() == 1005
    e0, t0 = gpu.energy_mj(), time.perf_counter()
    _busy(0.05)
    e1, t1 = gpu.energy_mj(), time.perf_counter()
    p = float(sim.power.busy_power_w(1005, 83.64))
    assert (e1 - e0) / 1000 == pytest.approx(p * (t1 - t0), rel=0.05)
    # the top clock runs at f_cap under the 400 W default limit: the counter never passes 400 W
    gpu.reset()
    assert gpu.sm_clock_mhz() < 1410
    e0, t0 = gpu.energy_mj(), time.perf_counter()
    _busy(0.05)
    assert (gpu.energy_mj() - e0) / 1000 <= 400.0 * (time.perf_counter() - t0) * 1.01


def test_unsupported_clock_or_no_permission_turns_locking_off(monkeypatch):
    gpu = NvmlGpu(0, nvml=SimulatedNvml("A40"))
    assert not gpu.set_frequency_mhz(1411) and not gpu.can_set_clocks
    monkeypatch.setenv(SIMULATED_ENV + "_DENY", "1")
    gpu = NvmlGpu(0, nvml=SimulatedNvml("A40"))
    assert not gpu.set_frequency_mhz(1005)


def test_open_gpu_from_the_environment(monkeypatch):
    monkeypatch.setenv(SIMULATED_ENV, "H100-SXM")
    assert open_gpu(0).name == "H100-SXM (simulated)"
    monkeypatch.setenv(SIMULATED_ENV, "T4")  # a transferred (not fitted) DVFS model
    assert open_gpu(0).name == "T4 (simulated)"
    monkeypatch.setenv(SIMULATED_ENV, "Z100")  # not a catalog GPU
    with pytest.raises(HetplanError) as e:
        open_gpu(0)
    assert e.value.field == SIMULATED_ENV
