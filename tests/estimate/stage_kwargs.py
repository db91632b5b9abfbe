"""Tests' shorthand for one stage: keyword arguments in the cost model's flat vocabulary (``t``, ``dp``, ``zero``,
``recompute``, ``framework``, ...) split into the :class:`~hetplan.degrees.Degrees`,
:class:`~hetplan.estimate.stagework.StageWork` and :class:`~hetplan.estimate.options.TrainingOptions` that
:func:`~hetplan.estimate.stage.stage_costs` and :func:`~hetplan.estimate.memory.stage_memory_bytes` take."""

from __future__ import annotations

from dataclasses import fields

from hetplan.degrees import Degrees
from hetplan.estimate.memory import StageMemory, stage_memory_bytes
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.stage import StageCost, stage_costs
from hetplan.estimate.stagework import Link, StageHardware, StageWork
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec

_WORK = {f.name for f in fields(StageWork)}
_OPTIONS = {f.name for f in fields(TrainingOptions)}
_DEGREES = {"t": "tp", "tp": "tp", "cp": "cp", "ep": "ep", "etp": "expert_tp", "expert_tp": "expert_tp",
            "virtual_stages": "virtual_stages"}
_ALIASES = {"recompute_code": "recompute", "kv_exchange": "cp_kv_exchange"}


def split(kw: dict, **option_defaults) -> tuple[Degrees, StageWork, TrainingOptions]:
    """``kw`` as (degrees, work, options); options not given take ``option_defaults``, then the dataclass's."""
    degrees, work, options = {}, {}, dict(option_defaults)
    dp = kw.get("dp", 1)
    for k, v in kw.items():
        k = _ALIASES.get(k, k)
        if k == "dp":
            continue
        if k in _DEGREES:
            degrees[_DEGREES[k]] = v
        elif k in _WORK:
            work[k] = v
        elif k in _OPTIONS:
            options[k] = tuple(v) if isinstance(v, list) else v
        elif k == "moe_options":
            options.update(moe_dispatcher=v.dispatcher, moe_routing=v.routing, moe_recompute=v.recompute,
                           moe_a2a_overlap=v.a2a_overlap)
        else:
            raise TypeError(f"unknown stage argument {k!r}")
    return (Degrees.of(dp=dp, zero=work.get("zero", 0), **degrees), StageWork(**work),
            TrainingOptions(**options))


def memory_of(m: ModelSpec, **kw) -> StageMemory:
    """:func:`stage_memory_bytes` of the stage ``kw`` describes (standard attention and the fp32 loss unless
    given, the defaults the memory tests were written against)."""
    return stage_memory_bytes(m, *split(kw, attention="standard", cross_entropy="fp32"))


def costs_of(m: ModelSpec, gpu: GPUSpec, link: Link, **kw) -> StageCost:
    """:func:`stage_costs` of the stage ``kw`` describes (``measured_layer_time_s`` passed through)."""
    measured = kw.pop("measured_layer_time_s", None)
    degrees, work, options = split(kw)
    return stage_costs(m, StageHardware(gpu, link), degrees, work, options, measured)
