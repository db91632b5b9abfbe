"""Optional NVML access: lock SM clocks and read the GPU energy counter.

Uses ``pynvml`` (``nvidia-ml-py``) when it is installed and an NVIDIA GPU is present; otherwise
:func:`open_gpu` returns None and callers run without frequency control (time is still measured).
Locking clocks usually needs administrator rights; a refusal is reported once and then ignored so training
continues at the default clocks.

NVML calls: ``nvmlDeviceSetGpuLockedClocks`` / ``nvmlDeviceResetGpuLockedClocks`` (SM clock range, MHz),
``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load; Volta and newer).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


class NvmlGpu:
    """One GPU through NVML.

    Args:
        index: NVML device index, or a device UUID (``"GPU-..."``, as ``CUDA_VISIBLE_DEVICES`` may list them).

    Raises:
        RuntimeError: NVML or the device is not available (use :func:`open_gpu` to get None instead).
    """

    def __init__(self, index: int | str = 0, nvml=None):
        if nvml is None:
            import pynvml as nvml

        pynvml = self._nvml = nvml
        self.simulated = isinstance(nvml, SimulatedNvml)
        pynvml.nvmlInit()
        self.index = index
        self.handle = (pynvml.nvmlDeviceGetHandleByUUID(index) if isinstance(index, str)
                       else pynvml.nvmlDeviceGetHandleByIndex(index))
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.can_set_clocks = True
        self._locked: int | None = None

    def supported_sm_clocks_mhz(self) -> list[int]:
        """SM clocks the GPU supports at its highest memory clock, descending (MHz)."""
        n = self._nvml
        mem = max(n.nvmlDeviceGetSupportedMemoryClocks(self.handle))
        return sorted(n.nvmlDeviceGetSupportedGraphicsClocks(self.handle, mem), reverse=True)

    def energy_mj(self) -> int:
        """Total energy since the driver loaded (mJ)."""
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def sm_clock_mhz(self) -> int:
        """Current SM clock (MHz)."""
        return int(self._nvml.nvmlDeviceGetClockInfo(self.handle, self._nvml.NVML_CLOCK_SM))

    def set_frequency_mhz(self, frequency_mhz: int) -> bool:
        """Lock the SM clock to ``frequency_mhz``; False (once logged) when not permitted."""
        if not self.can_set_clocks:
            return False
        if self._locked == frequency_mhz:
            return True
        try:
            self._nvml.nvmlDeviceSetGpuLockedClocks(self.handle, frequency_mhz, frequency_mhz)
            self._locked = frequency_mhz
            return True
        except self._nvml.NVMLError as exc:
            log.warning("cannot lock GPU %s clocks (%s); running at default clocks", self.index, exc)
            self.can_set_clocks = False
            return False

    def reset(self) -> None:
        """Release the clock lock."""
        if self._locked is not None:
            try:
                self._nvml.nvmlDeviceResetGpuLockedClocks(self.handle)
            except self._nvml.NVMLError:  # pragma: no cover - depends on permissions
                pass
            self._locked = None


def nvml_device(cuda_index: int, visible: str | None = None) -> int | str:
    """The NVML device (index or UUID) of CUDA device ``cuda_index``: CUDA numbers only the devices
    ``CUDA_VISIBLE_DEVICES`` lists (``visible``, default: the environment's), in its order; NVML numbers all of
    them (NVML API reference, "CUDA_VISIBLE_DEVICES"; CUDA C Programming Guide, environment variables)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [x.strip() for x in (visible or "").split(",") if x.strip()]
    if cuda_index >= len(ids):
        return cuda_index
    x = ids[cuda_index]
    return int(x) if x.isdigit() else x


#: Environment variable naming a catalog GPU: :func:`open_gpu` then returns a :class:`SimulatedNvml` device.
SIMULATED_ENV = "HETPLAN_SIMULATED_NVML"


class SimulatedNvml:
    """The pynvml calls :class:`NvmlGpu` makes, answered on CPU by a GPU's DVFS model (:mod:`hetplan.hardware.power`):
    the training loop's NVML path (lock clocks, read the energy counter, reset) runs end to end without a GPU.

    The simulated board supports exactly the model's clocks (others: ``NVMLError``, as NVML refuses clocks off its
    table), sustains ``f_eff = min(locked, f_cap)`` under its default power limit (the TDP), and its energy
    counter (mJ) integrates ``P_busy(f_eff)`` over wall-clock time (the CPU's time: the clock does not slow the
    host down, so only power follows the clock, and waiting counts as busy: an upper bound). Energy read from it
    is reported as ``energy_source = "model"``, never as measured. ``HETPLAN_SIMULATED_NVML_DENY=1`` makes locking
    fail with a permission error, as on a GPU without administrator rights.

    Args:
        gpu_name: catalog GPU with a DVFS model.

    Raises:
        HetplanError: unknown GPU or no DVFS model.
    """

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        """What pynvml raises."""

    def __init__(self, gpu_name: str):
        import time

        from hetplan.hardware.catalog import load_catalog
        from hetplan.hardware.power import board_limited, get_power

        spec = load_catalog().get(gpu_name, field=SIMULATED_ENV)
        self.gpu, self.idle_w = spec.name, spec.idle_power_w
        self.power = board_limited(get_power(spec.name, field=SIMULATED_ENV), spec.tdp_w, spec.idle_power_w)
        self._clock = time.perf_counter
        self._locked: dict[int, int | None] = {}
        self._energy_mj: dict[int, float] = {}
        self._since: dict[int, float] = {}

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        self._locked.setdefault(index, None)
        self._energy_mj.setdefault(index, 0.0)
        self._since.setdefault(index, self._clock())
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        return self.nvmlDeviceGetHandleByIndex(abs(hash(uuid)) % 1024)

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return f"{self.gpu} (simulated)"

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: int) -> list[int]:  # noqa: N802
        return [1]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: int, memory_mhz: int) -> list[int]:  # noqa: N802
        return list(self.power.frequencies_mhz)

    def _advance(self, handle: int) -> None:
        now = self._clock()
        f = self.nvmlDeviceGetClockInfo(handle, self.NVML_CLOCK_SM)
        self._energy_mj[handle] += 1000.0 * float(self.power.busy_power_w(f, self.idle_w)) * (now - self._since[handle])
        self._since[handle] = now

    def nvmlDeviceGetClockInfo(self, handle: int, which: int) -> int:  # noqa: N802
        f = self._locked.get(handle) or self.power.max_frequency_mhz
        return int(self.power.effective_frequency_mhz(f, self.idle_w))

    def nvmlDeviceSetGpuLockedClocks(self, handle: int, lo: int, hi: int) -> None:  # noqa: N802
        import os

        if os.environ.get(SIMULATED_ENV + "_DENY"):
            raise self.NVMLError("Insufficient Permissions")
        if lo != hi or lo not in self.power.frequencies_mhz:
            raise self.NVMLError(f"Invalid Argument: {lo}-{hi} MHz is not a supported clock")
        self._advance(handle)
        self._locked[handle] = lo

    def nvmlDeviceResetGpuLockedClocks(self, handle: int) -> None:  # noqa: N802
        self._advance(handle)
        self._locked[handle] = None

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        self._advance(handle)
        return int(self._energy_mj[handle])


def open_gpu(index: int | str = 0) -> NvmlGpu | None:
    """An :class:`NvmlGpu` for NVML device ``index`` (see :func:`nvml_device`), or None without pynvml / NVIDIA
    driver / device; with ``$HETPLAN_SIMULATED_NVML`` set to a catalog GPU, one over :class:`SimulatedNvml`."""
    name = os.environ.get(SIMULATED_ENV)
    if name:
        return NvmlGpu(index, nvml=SimulatedNvml(name))
    try:
        return NvmlGpu(index)
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_InvalidArgument, ...
        log.info("NVML not available: %s", exc)
        return None
