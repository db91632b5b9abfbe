"""Perseus-style GPU frequency planning on the iteration time–energy frontier (see ``docs/energy.md``).

Modules: :mod:`.profile` (stage profile CSV), :mod:`.options` (Pareto options, exponential energy model),
:mod:`.dag` (pipeline DAG), :mod:`.solver` (Phillips–Dessouky frontier), :mod:`.maxflow` (min cuts),
:mod:`.frontier` (frontier and frequency plans), :mod:`.simulate` (replay on the measured profile),
:mod:`.baselines` (all-max, EnvPipe, ZeusGlobal, ZeusPerStage), :mod:`.report` (savings, straggler, plot),
:mod:`.model` (stage profiles derived from a plan and the DVFS power model), :mod:`.job` (a plan's energy per
iteration and job, and the time–$–energy frontier), :mod:`.calibrate` (the power model fitted on Perseus'
profiles), power limits as the knob (:mod:`.power_limit`, Zeus), :mod:`.validation` (the energy set of
``hetplan validate``), :mod:`.inference` (J per request and per output token of a serving run), :mod:`.server` (plan server,
needs the ``serve`` extra), :mod:`.client` and :mod:`.nvml` (training ranks).
"""

from hetplan.energy.frontier import FrequencyPlan, Frontier, compute_frontier
from hetplan.energy.profile import StageProfile, load_stage_profile, parse_stage_profile

__all__ = ["FrequencyPlan", "Frontier", "StageProfile", "compute_frontier", "load_stage_profile", "parse_stage_profile"]
