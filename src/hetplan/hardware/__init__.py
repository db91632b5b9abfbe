"""Hardware and software as dated, sourced package data: the GPU and node catalogs (:mod:`.catalog`), GPU power
under DVFS (:mod:`.power`), prices (:mod:`.prices`), training stacks (:mod:`.stacks`) and serving engines
(:mod:`.engines`). Inventories (pools of these GPUs) are part of the plan schema, :mod:`hetplan.plan`."""

from hetplan.hardware.catalog import GPUSpec, Catalog, load_catalog, get_gpu

__all__ = ["GPUSpec", "Catalog", "load_catalog", "get_gpu"]
