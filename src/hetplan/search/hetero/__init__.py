"""Heterogeneous GPU allocation and stage placement: which GPUs, how many, in which stage order, with which layers.

**Space.** A plan uses one micro-batch size ``b``, one data-parallel degree ``d`` for every stage (the 1F1B closed
form of :func:`hetplan.estimate.pipeline.pipeline_time_s` counts the micro-batches of the first stage; with
different DP degrees per stage the stages would not process the same micro-batches), a ZeRO stage 0 or 1
(the pipeline engines of Megatron-LM and DeepSpeed support no more), one context-parallel degree ``cp`` and one
expert-parallel degree ``ep`` (the homogeneous space's degrees, :func:`hetplan.search.space.cp_degrees` and
:func:`hetplan.search.space.ep_degrees`). From each pool ``k`` it takes ``s_k >= 0`` stages of ``tp_k x cp x d``
GPUs each (TP differs between pools, is the same within one pool; a power of two dividing
the heads, at most the pool's GPUs per node, ``s_k tp_k d <= count_k``). The stages of one pool form one
contiguous block of the pipeline, and the blocks come in any order (``K!`` orders for ``K`` pools used): stages
of a pool take consecutive GPUs (nodes), so consecutive stages of one pool may share a node and talk over the
intra-node link (:func:`hetplan.plan.boundary_is_intra_node`); a boundary between pools uses the slower of the
two nodes' NICs. Each stage holds ``n_i >= 1`` layers (the first also the embedding, the last the head); its
recomputation is the lightest that fits in memory at its position (stage ``i`` of ``p`` holds
``min(p - i, m)`` micro-batches in flight under 1F1B). Homogeneous plans (one pool) are in the space.

Choosing the lightest recomputation that fits is exact: a heavier one adds ``Δ`` to the stage's backward, which
adds at least ``Δ`` to the iteration (the sum term) and can lower the exposed DP time by at most ``Δ``.

The package, one concept a module, each depending only on those above it:

* :mod:`~hetplan.search.hetero.tables` — stage types (pool × TP) and their cost tables over (stage kind,
  micro-batches in flight, layers, recomputation), from the estimator's own stage costs;
* :mod:`~hetplan.search.hetero.group` — one (micro-batch, DP, ZeRO, CP, EP) group: its tables, boundary
  transfer times, the lower bounds of one stage order and the exact layer partition of an order;
* :mod:`~hetplan.search.hetero.bounds` — every GPU allocation of a group on arrays, with lower bounds of its
  iteration time valid for every stage order and partition (``T_LB``, ``T_SIM``);
* :mod:`~hetplan.search.hetero.allocations` — the groups of a search space and their bounded allocations,
  shrinking the space when it is too large, and the best order and partition of one allocation;
* :mod:`~hetplan.search.hetero.closed_form` — :func:`search_hetero`, exact over the space for the closed-form
  iteration time (cheapest, fastest, Pareto);
* :mod:`~hetplan.search.hetero.estimated` — :func:`search_hetero_estimated`, the best plans by
  :func:`hetplan.estimate.estimator.estimate` itself, exact over one plan per allocation.
"""

from hetplan.search.hetero.allocations import PreparedSpace
from hetplan.search.hetero.bounds import allocation_bounds
from hetplan.search.hetero.closed_form import HeteroCandidate, HeteroResult, StageChoice, search_hetero
from hetplan.search.hetero.estimated import EstimatedPlan, EstimatedResult, search_hetero_estimated
from hetplan.search.hetero.tables import CostTable, StageType, cost_table, cost_tables, stage_types

__all__ = [
    "CostTable", "EstimatedPlan", "EstimatedResult", "HeteroCandidate", "HeteroResult", "PreparedSpace",
    "StageChoice", "StageType", "allocation_bounds", "cost_table", "cost_tables", "search_hetero",
    "search_hetero_estimated", "stage_types",
]
