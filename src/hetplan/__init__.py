"""hetplan: plan, price and run large-model training and serving on GPU clusters.

See ``DESIGN.md`` in the shared folder and the README for the data flow:
model spec + inventory + job -> search -> plan -> estimate.
"""

__version__ = "0.1.0"
