"""Run plans for real and hand them to training frameworks.

* :mod:`hetplan.runtime.planio` — read a plan JSON and check that the runtime can run it (no torch);
* :mod:`hetplan.runtime.launcher` — start the ranks (torchrun, local or multi-node);
* :mod:`hetplan.runtime.trainer` — the reference trainer on ``torch.distributed`` (pipelining, DDP/FSDP2, DTensor TP);
* :mod:`hetplan.runtime.exporters` — Megatron-LM, DeepSpeed and torchtitan launch arguments / configs (no torch);
* :mod:`hetplan.runtime.verify` — profile -> estimate -> run -> predicted vs measured.

Importing this package does not import torch; only the trainer, the profiler and verify's measuring steps do.
"""
