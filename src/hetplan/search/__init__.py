"""Plan search over the cost model of :mod:`hetplan.estimate` (every search prices a configuration with it).

* :mod:`.planner` — ``hetplan plan``'s search: the homogeneous exact top K of every pool, and with several pools
  the heterogeneous search, ranked together by :func:`hetplan.estimate.estimator.estimate`;
* :mod:`.space` — the homogeneous space as arrays (TP, PP, DP, CP, EP, micro-batch, ZeRO, recomputation) and the
  user's :class:`~hetplan.search.space.Pins`; :mod:`.homogeneous` — its vectorised exhaustive evaluation;
* :mod:`.hetero` — heterogeneous GPU allocation, stage order and layer partition (exact), and
  :mod:`.partition` — the exact layer partition of one stage order;
* :mod:`.pareto` — the cost–time Pareto frontier; :mod:`.fine` and :mod:`.fine_cost` — the Aceso-style
  bottleneck-alleviation search (per-stage GPUs, TP, DP, per-layer recomputation);
* :mod:`.objective` — objectives, constraints and the lower-bound-guarded best-first walk;
  :mod:`.explain` — why the best plan wins.
"""
