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

    def __init__(self, index: int | str = 0):
        import pynvml

        self._nvml = pynvml
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


def open_gpu(index: int | str = 0) -> NvmlGpu | None:
    """An :class:`NvmlGpu` for NVML device ``index`` (see :func:`nvml_device`), or None without pynvml / NVIDIA
    driver / device."""
    try:
        return NvmlGpu(index)
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_InvalidArgument, ...
        log.info("NVML not available: %s", exc)
        return None
