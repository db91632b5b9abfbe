"""GPU catalog (dated, sourced package data), nodes, links and cluster inventories."""

from hetplan.hardware.catalog import GPUSpec, Catalog, load_catalog, get_gpu

__all__ = ["GPUSpec", "Catalog", "load_catalog", "get_gpu"]
