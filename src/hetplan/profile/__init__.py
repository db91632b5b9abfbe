"""Profiles: the torch profiler (:mod:`hetplan.profile.profiler`, needs the ``torch`` extra), the SQLite profile
database (:mod:`hetplan.profile.db`) and importers of other systems' profiles (:mod:`hetplan.profile.importers`).

Importing this package does not import torch.
"""
