"""The cost model: time, memory and money of a plan (see :func:`hetplan.estimate.estimator.estimate`); its
energy is :mod:`hetplan.energy`'s, on these stage times."""
