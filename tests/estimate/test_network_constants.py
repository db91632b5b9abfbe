"""The communication constants are data (hardware/data/network.toml, every value sourced), and a calibration's
constants reach every collective of a stage, the MoE all-to-all and the CP exchange included (issue 24)."""

import dataclasses

from hetplan.estimate import comm
from hetplan.estimate.comm import CommConstants
from hetplan.estimate.estimator import estimate
from hetplan.hardware.network import load_network
from hetplan.plan import GPUPool, Job, Plan, Stage


def test_constants_come_from_the_sourced_file():
    net = load_network()
    assert set(net.sources) == {"alpha_intra_node_s", "alpha_inter_node_s", "intra_link_efficiency",
                                "inter_link_efficiency", "p2p_call_s", "nccl_ctas"}
    assert all(len(s) > 20 for s in net.sources.values())
    assert all(len(n.source) > 20 for n in net.networks.values())
    cc = CommConstants()
    assert (cc.alpha_intra_node_s, cc.alpha_inter_node_s, cc.p2p_call_s) == (
        net.alpha_intra_node_s, net.alpha_inter_node_s, net.p2p_call_s)
    assert comm.NCCL_CTAS == net.nccl_ctas == cc.nccl_ctas and set(comm.NETWORKS) == set(net.networks)
    assert cc.network_terms("ethernet") == comm.network_terms("ethernet")
    assert cc.network_terms("ethernet")[0] < cc.network_terms("infiniband")[0] == 1.0


def _forward_s(plan: Plan, **constants) -> float:
    return estimate(plan, comm_constants=dataclasses.replace(CommConstants(), **constants)).stages[0].forward_s


def test_intra_node_latency_reaches_the_moe_alltoall_and_the_cp_exchange():
    """With TP 1 a stage's forward holds no TP collective and no DP one: only the all-to-all (EP 8 in a node)
    and the CP K/V all-gather carry the intra-node latency, and a calibration's larger one slows it (before, both
    read the module's constant and ignored the calibration)."""
    moe = Plan(job=Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=8), pools=[GPUPool(gpu="H100-SXM", count=8)],
               stages=[Stage(num_layers=48, tp=1, dp=8, recompute="full")], mbs=1, zero=0, ep=8)
    dense = Plan(job=Job(model="llama3-8b", seq_len=32768, global_batch=1, cp_kv_exchange="allgather"),
                 pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=1, dp=1)], mbs=1, cp=8)
    for plan in (moe, dense):
        assert _forward_s(plan, alpha_intra_node_s=1e-3) > _forward_s(plan)



def test_intra_node_link_efficiency_reaches_the_tp_collectives_the_alltoall_and_the_cp_exchange():
    """A calibration's NCCL intra-node efficiency reaches the TP all-reduces (TP 8 in a node), the MoE all-to-all
    (EP 8) and the CP K/V all-gather, through the stage's Link (before, these read the module's constant)."""
    tp = Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=8), pools=[GPUPool(gpu="H100-SXM", count=8)],
              stages=[Stage(num_layers=32, tp=8, dp=1)], mbs=1)
    moe = Plan(job=Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=8), pools=[GPUPool(gpu="H100-SXM", count=8)],
               stages=[Stage(num_layers=48, tp=1, dp=8, recompute="full")], mbs=1, zero=0, ep=8)
    dense = Plan(job=Job(model="llama3-8b", seq_len=32768, global_batch=1, cp_kv_exchange="allgather"),
                 pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=1, dp=1)], mbs=1, cp=8)
    for plan in (tp, moe, dense):
        assert _forward_s(plan, intra_link_efficiency=0.3) > _forward_s(plan)
    assert _forward_s(tp, intra_link_efficiency=comm.INTRA_LINK_EFFICIENCY) == _forward_s(tp)


def test_pipeline_p2p_inside_a_node_takes_the_calibrated_latency():
    """The p2p sends between two pipeline stages in one node read the links' p2p latency (CommConstants'
    alpha_inter_node_s; before, the estimator rebuilt the boundary links from five fields and the module's
    constant was used)."""
    plan = Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=8), pools=[GPUPool(gpu="H100-SXM", count=8)],
                stages=[Stage(num_layers=16, tp=4, dp=1), Stage(num_layers=16, tp=4, dp=1)], mbs=1)

    def iteration_s(**constants) -> float:
        return estimate(plan, comm_constants=dataclasses.replace(CommConstants(), **constants)).iteration_time_s

    base = iteration_s()
    assert iteration_s(alpha_inter_node_s=1e-3) > base
    assert iteration_s(alpha_inter_node_s=CommConstants().alpha_inter_node_s) == base


def test_nccl_thread_blocks_reach_the_overlapped_collectives():
    """With --tp-comm-overlap the TP collectives hide behind the GEMMs but their NCCL kernels take
    nccl_ctas / sm_count of the SMs: a calibration's larger count slows the forward (before, the module's)."""
    plan = Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=8), pools=[GPUPool(gpu="H100-SXM", count=8)],
                stages=[Stage(num_layers=32, tp=8, dp=1)], mbs=1, sequence_parallel=True, tp_comm_overlap=True)
    assert _forward_s(plan, nccl_ctas=4 * comm.NCCL_CTAS) > _forward_s(plan)
