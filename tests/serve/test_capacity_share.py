"""capacity with shared replica groups (Computron's setting in Mélange's program): models co-located on one
replica group by swapping are chosen when cheaper and meet the SLOs in simulation; the integer program with
group columns equals brute force; the export launches a group as sleep-mode instances on the same GPUs."""

import itertools
import json

import numpy as np
import pytest

from hetplan.serve.capacity import _solve, plan_capacity
from hetplan.serve.replica import simulate_workload, slos, workload_requests
from hetplan.serve.config import load_workload_config
from hetplan.serve.export import parse_args, replicas_from_capacity, write_export

from .test_cli import EXAMPLES
from .test_export import _argv, _devices, _router


def test_integer_program_with_shared_groups_equals_brute_force():
    """Two models, two dedicated configurations (prices 3 and 5 $/h, 1 and 2 GPUs of type X) and a shared
    group of both (price 4, 2 GPUs of X, serving both whole loads): the program's cost is the cheapest of all
    assignments of up to 3 replicas each and the group on or off, at most 4 GPUs."""
    rates = np.array([[2.0, 5.0], [1.0, 3.0]])
    prices, gpus_per, gpu_of = np.array([3.0, 5.0]), np.array([1, 2]), ["X", "X"]
    groups = [([0, 1], 4.0, "X", 2), ([1], 0.5, "X", 1)]  # a model may be in one chosen group at most
    for loads in ([1.0, 1.0], [3.0, 0.5], [6.0, 2.0], [1.5, 2.5]):
        best = None
        for x in itertools.product(range(4), repeat=4):
            for y in itertools.product((0, 1), repeat=2):
                xm = np.array(x).reshape(2, 2)
                covered = (xm * rates).sum(1) + np.array([y[0], y[0] + y[1]]) * np.array(loads)
                if any(covered < loads) or (xm * gpus_per).sum() + 2 * y[0] + y[1] > 4 or y[0] + y[1] > 1:
                    continue
                cost = float((xm * prices).sum() + 4.0 * y[0] + 0.5 * y[1])
                best = cost if best is None else min(best, cost)
        got = _solve(rates, prices, np.array(loads), gpu_of, gpus_per, 4, groups)
        assert (got is None) == (best is None)
        if got is not None:
            x, used = got
            assert sum(1 in groups[j][0] for j in used) <= 1
            assert float((x * prices).sum() + sum(groups[j][1] for j in used)) == pytest.approx(best)


def test_capacity_shares_gpus_when_cheaper(tmp_path):
    """examples/serve/capacity.toml (three OPT-13B at 1 req/s each, latency SLO 1.5 s at 95 %): dedicated
    replicas cost 7.42 $/h at the catalog's prices (3 x A100-SXM-80GB); the three models sharing one TP 2 group
    cost 4.95 $/h and meet the SLOs, which `hetplan simulate` of that cluster confirms independently; the export starts them
    as sleep-mode vLLM instances on the same 4 GPUs, within the memory fraction together."""
    wf = load_workload_config(EXAMPLES / "capacity.toml")
    shared, dedicated = plan_capacity(wf), plan_capacity(wf, share=False)
    assert not dedicated["shared"] and shared["shared"]
    assert shared["price_usd_per_hour"] < dedicated["price_usd_per_hour"]
    assert shared["price_usd_per_hour"] == pytest.approx(
        sum(r["price_usd_per_hour"] for r in shared["mix"] + shared["shared"]))
    served = [m for r in shared["shared"] for m in r["models"]] + [r["model"] for r in shared["mix"]]
    assert sorted(served) == sorted(shared["load_per_s"])  # every model once: a group or its own replicas
    reqs = workload_requests(wf)
    for g in shared["shared"]:
        assert g["price_usd_per_hour"] == pytest.approx(g["gpus"] * shared["prices"][g["gpu"]]["usd_per_gpu_hour"])
        own = wf.model_copy(deep=True)  # the group as a `hetplan simulate` cluster
        own.cluster.gpu, own.cluster.tp, own.cluster.pp = g["gpu"], g["tp"], g["pp"]
        own.models = [m for m in wf.models if m.name in g["models"]]
        rep = simulate_workload(own, requests=[r for r in reqs if r.model in g["models"]]).report(slos(wf))
        for m in g["models"]:
            assert rep["models"][m]["slo_attainment"] >= shared["target_attainment"]
            assert rep["models"][m]["slo_attainment"] == pytest.approx(shared["simulated"][m]["slo_attainment"])
    write_export("vllm", replicas_from_capacity(wf, shared), tmp_path)
    scripts = sorted(tmp_path.glob("replica-*.sh"))
    assert len(scripts) == len(served)
    args = [parse_args("vllm", _argv(s)) for s in scripts]
    assert all(a["enable_sleep_mode"] for a in args)
    g = shared["shared"][0]
    assert all(_devices(s) == list(range(g["gpus"])) for s in scripts)
    assert 0 < sum(a["gpu_memory_utilization"] for a in args) <= wf.cluster.memory_fraction + 1e-3
    router = _router(tmp_path / "router.yaml")
    rpm = {d["model_name"]: d["litellm_params"]["rpm"] for d in router["model_list"]}
    assert rpm == {m: int(60 * shared["load_per_s"][m]) for m in g["models"]}
    manifest = json.loads((tmp_path / "replicas.json").read_text())
    assert len({r["group"] for r in manifest["replicas"]}) == 1
