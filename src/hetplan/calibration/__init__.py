"""Calibration and validation of the estimator against public measurements (above ``hetplan.estimate``)."""
