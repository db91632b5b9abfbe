"""Serving many large models on shared GPUs with model-parallel weight swapping (Computron), and its simulator.

Torch-free modules (light core install): :mod:`~hetplan.serve.workload`, :mod:`~hetplan.serve.swap_model`,
:mod:`~hetplan.serve.exec_model`, :mod:`~hetplan.serve.policies`, :mod:`~hetplan.serve.scheduler`,
:mod:`~hetplan.serve.simulator`, :mod:`~hetplan.serve.metrics`, :mod:`~hetplan.serve.config`,
:mod:`~hetplan.serve.capacity`. Torch: :mod:`~hetplan.serve.engine` (and :mod:`~hetplan.serve.worker`).
FastAPI: :mod:`~hetplan.serve.api`. See docs/serving.md.
"""
