"""The cost model: time, memory, money and energy of a plan (see :func:`hetplan.estimate.estimator.estimate`)."""
