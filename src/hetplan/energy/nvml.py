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

log = logging.getLogger(__name__)


class NvmlGpu:
    """One GPU through NVML.

    Args:
        index: NVML device index.

    Raises:
        RuntimeError: NVML or the device is not available (use :func:`open_gpu` to get None instead).
    """

    def __init__(self, index: int = 0):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
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
            log.warning("cannot lock GPU %d clocks (%s); running at default clocks", self.index, exc)
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


def open_gpu(index: int = 0) -> NvmlGpu | None:
    """An :class:`NvmlGpu` for device ``index``, or None without pynvml / NVIDIA driver / device."""
    try:
        return NvmlGpu(index)
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_InvalidArgument, ...
        log.info("NVML not available: %s", exc)
        return None
