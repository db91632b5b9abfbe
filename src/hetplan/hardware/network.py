"""The communication constants as data: ``data/network.toml`` (every value with its source), read once.

:func:`load_network` returns :class:`NetworkConstants`; :class:`hetplan.estimate.comm.CommConstants` takes its
defaults from it, and the estimator builds every stage's links from a ``CommConstants``
(:func:`hetplan.estimate.estimator.pool_link`), so a calibration's fitted values reach every collective of the
cost model (TP, DP, the MoE all-to-all, the CP exchange, the pipeline calls).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from hetplan.inputs import parse_toml


class NetworkTerms(BaseModel):
    """One inter-node network: per-step latency (s) and the fraction of the line rate NCCL reaches."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha_s: float = Field(gt=0, lt=1e-2)
    efficiency: float = Field(gt=0, le=1)
    source: str


class NetworkConstants(BaseModel):
    """The ``[collectives]`` table of ``network.toml`` and its ``[networks]`` (fields: the file's comments)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha_intra_node_s: float = Field(gt=0, lt=1e-2)
    alpha_inter_node_s: float = Field(gt=0, lt=1e-2)
    intra_link_efficiency: float = Field(gt=0, le=1)
    inter_link_efficiency: float = Field(gt=0, le=1)
    p2p_call_s: float = Field(ge=0, lt=1.0)
    nccl_ctas: int = Field(gt=0)
    sources: dict[str, str]
    networks: dict[str, NetworkTerms]


@lru_cache(maxsize=1)
def load_network() -> NetworkConstants:
    """The package's communication constants (``data/network.toml``)."""
    data = parse_toml(resources.files("hetplan.hardware").joinpath("data/network.toml").read_text(), "network.toml")
    return NetworkConstants(**data["collectives"], networks=data["networks"])
