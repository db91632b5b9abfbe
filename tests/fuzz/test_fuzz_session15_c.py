"""Session 15 (probe c): launch units (hosts) of inventories with several pools, NVL72 racks and DGX nodes."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from hetplan.plan import GPUPool, pools_fill_whole_hosts
from tests.fuzz.inproc import run_cli

JOB = """[job]
model = "llama2-7b"
seq_len = 4096
global_batch = 256
train_tokens = 1e10
dtype = "bf16"

[objective]
goal = "fastest"
"""


def _inventory(pools: list[tuple[str, int]]) -> str:
    return "".join(f'\n[[inventory]]\ngpu = "{g}"\ncount = {n}\n' for g, n in pools)


def test_heterogeneous_plans_put_each_pool_on_whole_hosts(tmp_path):
    """6 GB200 (trays of 4) and 10 H100 (servers of 8): the search proposed GB200 x 6 + H100 x 10 at TP 1 DP 2, and
    the export wrote 4 hosts of 4, one of them holding 2 GB200 and 2 H100. Each pool's ranks now fill whole hosts of
    the launch's 4, and the export refuses a plan edited to break that."""
    f = tmp_path / "job.toml"
    f.write_text(JOB + _inventory([("GB200", 6), ("H100-SXM", 10)]))
    r = run_cli("plan", f, "--top", "5", "--json")
    assert r.code == 0, r.stderr + r.traceback
    plans = json.loads(r.stdout)["plans"]
    for p in plans:
        plan = p["plan"]
        used = [0] * len(plan["pools"])
        for s in plan["stages"]:
            used[s["pool"]] += s["tp"] * plan["cp"] * s["dp"]
        hosts = [GPUPool(**pool).launch_gpus for pool in plan["pools"]]
        assert pools_fill_whole_hosts(used, hosts), (used, hosts)
        assert "export_refused" not in p
    # the plan the search proposed: 6 GB200 + 10 H100 as stages of 2 ranks (tp 1 x dp 2)
    bad = {**plans[0]["plan"], "pools": [{"gpu": "GB200", "count": 6}, {"gpu": "H100-SXM", "count": 10}], "stages": [{"pool": 0, "num_layers": 6, "tp": 1, "dp": 2}] * 3
           + [{"pool": 1, "num_layers": 3, "tp": 1, "dp": 2}] * 4 + [{"pool": 1, "num_layers": 2, "tp": 1, "dp": 2}]}
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(bad))
    r = run_cli("export", out, "--to", "megatron")
    assert r.code == 2 and not r.traceback, r.stdout + r.stderr + r.traceback
    assert "plan.pools[0]" in r.stderr and "two pools" in r.stderr, r.stderr


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([1, 2, 4, 8, 72])), min_size=1, max_size=4))
def test_pools_fill_whole_hosts_is_fills_whole_nodes_on_one_pool_and_whole_hosts_on_several(pools):
    gpus, hosts = [n for n, _ in pools], [h for _, h in pools]
    used = [(n, h) for n, h in pools if n]
    got = bool(pools_fill_whole_hosts(gpus, hosts))
    if len(used) <= 1:
        assert got == (not used or used[0][0] <= used[0][1] or used[0][0] % used[0][1] == 0)
    else:
        per = min(h for _, h in used)
        assert got == all(n % per == 0 for n, _ in used)


def test_hosts_must_tile_the_nvlink_domain():
    """A GB200 pool with hosts of 5 (72 is no multiple of 5), or a node of 6 keeping the rack's trays of 4, was
    planned with hosts spanning two NVLink domains, exit 0. Refused, naming gpus_per_host."""
    import pytest

    for kw in ({"gpus_per_host": 5}, {"gpus_per_host": 16}, {"gpus_per_node": 6}):
        with pytest.raises(ValueError, match="does not divide gpus_per_node"):
            GPUPool(gpu="GB200", count=40, **kw)
    assert GPUPool(gpu="GB200", count=40, gpus_per_host=8).launch_gpus == 8
    assert GPUPool(gpu="H100-SXM", count=16, gpus_per_node=4).launch_gpus == 4


def test_power_limit_commands_index_the_gpu_of_its_host():
    """On an NVL72 rack the power-limit commands named GPU 37 of a 4-GPU tray (rank modulo the rack's 72); the local
    index is the rank modulo the processes per host, as the export launches them."""
    from hetplan.energy.power_limit import PowerLimitPoint, rank_settings
    from hetplan.plan import Job, Plan, Stage

    plan = Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=64), mbs=1,
                pools=[GPUPool(gpu="GB200", count=64)], stages=[Stage(num_layers=32, tp=1, dp=64)])
    point = PowerLimitPoint(share_of_tdp=0.83, power_limit_w={"GB200": 1000.0}, clock_mhz={"GB200": 1800.0},
                            iteration_time_s=1.0, energy_j=1.0, average_power_w=1000.0)
    ranks = rank_settings(plan, point)
    assert plan.processes_per_host == 4 and max(r["local_gpu"] for r in ranks) == 3
    assert ranks[37]["nvidia_smi"] == "nvidia-smi -i 1 -pl 1000"
