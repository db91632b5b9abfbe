"""Hosts versus NVLink domains: a GB200 / GB300 NVL72 rack is one NVLink domain of 72 GPUs on 18 compute trays of
4, and torchrun starts its processes per tray. The search, the exports and the importers count launches in hosts
(:attr:`hetplan.plan.GPUPool.launch_gpus`), the cost model NVLink domains (``gpus_per_node``)."""

import json

from hetplan.plan import GPUPool, fills_whole_nodes
from hetplan.runtime.importers import launch_pool
from tests.fuzz.inproc import run_cli


def test_nvl72_pools_launch_per_tray_and_dgx_per_server():
    gb = GPUPool(gpu="GB200", count=256)
    assert (gb.gpus_per_node, gb.gpus_per_host, gb.launch_gpus) == (72, 4, 4)
    assert GPUPool(gpu="GB300", count=8).launch_gpus == 4
    h = GPUPool(gpu="H100-SXM", count=64)
    assert (h.gpus_per_node, h.launch_gpus) == (8, 8)
    assert fills_whole_nodes(256, gb.launch_gpus) and not fills_whole_nodes(12, h.launch_gpus)
    # a launch of trays keeps the rack's NVLink domain; 8 per host on H100 is the DGX node itself
    assert launch_pool("GB200", 256, 4) == gb
    assert launch_pool("H100-SXM", 16, 8).gpus_per_node == 8
    assert launch_pool("H100-SXM", 8, 4).launch_gpus == 4


def test_a_gb200_job_of_whole_trays_uses_them_and_its_launch_round_trips(tmp_path):
    """80 GB200 are 20 trays. The search kept to one rack or whole racks (72 of the 80, or 144 of 256, because 80
    "span nodes of 72 without filling them"), so NVIDIA's own GB200 job sizes (128, 256, 512) were never planned;
    the export would have launched 64 processes on a 4-GPU tray. Now the plan uses all 80, the launch is 20 trays of
    4, and its import prices the same plan (the 72-GPU NVLink domain kept)."""
    out = tmp_path / "plan.json"
    r = run_cli("plan", "--model", "llama3-8b", "--gpu", "GB200", "--gpus", "80", "--tp", "4", "--pp", "1",
                "--seq-len", "4096", "--global-batch", "160", "--top", "1", "-q", "-o", out)
    assert r.code == 0 and not r.traceback, r.stderr
    plan = json.loads(out.read_text())
    assert sum(st["tp"] * st["dp"] * plan.get("cp", 1) for st in plan["stages"]) == 80
    r = run_cli("export", out, "--to", "megatron", "--out-dir", tmp_path / "x")
    assert r.code == 0, r.stderr
    launch = (tmp_path / "x" / "megatron_launch.sh").read_text()
    assert "torchrun --nnodes 20 --nproc-per-node 4 " in launch
    back = tmp_path / "back.json"
    assert run_cli("import", tmp_path / "x" / "megatron_launch.sh", "-o", back).code == 0
    assert json.loads(back.read_text())["pools"][0]["gpus_per_node"] == 72
    times = [json.loads(run_cli("estimate", p, "--json").stdout)["iteration_time_s"] for p in (out, back)]
    assert times[0] == times[1]
    # a DGX H100 job still launches whole servers: 12 GPUs on 8-GPU servers is refused, naming the host size
    r = run_cli("plan", "--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "16", "--use-gpus", "12",
                "--seq-len", "4096", "--global-batch", "96")
    assert r.code == 2 and "hosts of 8 GPUs" in r.stderr


def test_hosts_larger_than_the_launch_say_how_to_start_them():
    """Stages on 8-GPU H100 servers and on 4-GPU trays: the launch starts 4 processes per node (torchrun starts
    the same number on every node), so an 8-GPU server must run two nodes of 4 — the export says so, with the
    devices each takes; a plan on one host size says nothing of it."""
    from hetplan.model.spec import load_model
    from hetplan.plan import Job, Plan, Stage
    from hetplan.runtime import exporters

    job = Job(model="llama3-8b", seq_len=4096, global_batch=64)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8), GPUPool(gpu="GB200", count=8)], mbs=1, zero=1,
                stages=[Stage(pool=0, num_layers=16, tp=1, dp=8), Stage(pool=1, num_layers=16, tp=1, dp=8)])
    assert plan.processes_per_host == 4
    notes = " ".join(exporters.export(plan, load_model("llama3-8b"), "megatron").notes)
    assert "pool 0 (H100-SXM) has hosts of 8 GPUs" in notes and "start 2 nodes on each such host" in notes
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3, CUDA_VISIBLE_DEVICES=4,5,6,7" in notes
    one = plan.model_copy(update={"pools": [GPUPool(gpu="H100-SXM", count=16)],
                                  "stages": [Stage(pool=0, num_layers=16, tp=1, dp=8)] * 2})
    assert "hosts of" not in " ".join(exporters.export(one, load_model("llama3-8b"), "megatron").notes)
