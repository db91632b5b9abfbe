"""The modern validation sets (hetplan.calibration.modern): every published row is either predicted or listed as
not expressible with its reason; errors per set against the done-when targets of issues 13 and 14 (where a
target is not met yet, the figure reached is asserted instead, docs/estimator.md "Modern sets")."""

import csv
import dataclasses
from importlib import resources

import pytest

from hetplan.calibration import modern
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.model import counts


@pytest.fixture(scope="module")
def run():
    return modern.run_modern()


def _file_rows(name):
    text = resources.files("hetplan.calibration").joinpath("validation_data", "modern", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def test_every_row_is_predicted_or_listed_with_a_reason(run):
    result, _ = run
    total = {s: result[s]["n"] + result[s]["not_expressible"]["n"] for s in modern.SET_NAMES}
    assert total["dgxc_h100"] + total["dgxc_gb200"] == len(_file_rows(modern.FILES["dgxc_h100"])) == 329
    titan = _file_rows(modern.FILES["torchtitan"])
    assert total["torchtitan"] == sum(1 for r in titan if r["cp"] in ("", "1"))
    llama = _file_rows(modern.FILES["llama3_405b"])
    assert total["llama3_405b"] == 2
    assert total["megatron_lm_h100"] == 11
    assert total["moe_h100"] == 16 + 18 + len(_file_rows(modern.FILES["moe_h100"][2])) == 16 + 18 + 13
    nemo = _file_rows(modern.FILES["long_context_cp"][0])
    assert total["long_context_cp"] == len(nemo) + (len(titan) - total["torchtitan"]) + (len(llama) - 2)
    assert total["bigscience_a100"] == len(_file_rows(modern.FILES["bigscience_a100"])) == 135
    for s in modern.SET_NAMES:
        for row in result[s]["not_expressible"]["rows"]:
            assert row["reason"] and row["key"].startswith(s)


def test_proxy_rows_keep_the_layer_count_they_ran_with():
    rows = _file_rows(modern.FILES["dgxc_h100"])
    proxy = next(r for r in rows if r["model"] == "Llama 3.1 405B" and r["num_gpus"] == "32" and r["layers"] == "7")
    m = modern.row_model(proxy)
    assert m.num_layers == 7 and m.hidden_size == 16384 and m.num_kv_heads == 8 and m.ffn_hidden_size == 53248


def test_tflops_convention_reproduces_the_llama3_step():
    """The Llama 3 paper's 400 TFLOP/s per GPU on 16,384 H100 is a 6.7 s step of 16M tokens (issue 13) with the
    model FLOPs the sets use (full s^2 attention, no recomputation)."""
    row = _file_rows(modern.FILES["llama3_405b"])[1]
    m = modern.row_model(row)
    flops = counts.model_flops_per_iteration(m, 2048.0, 8192.0)
    assert flops == pytest.approx(4.42e19, rel=0.01)
    assert flops / (400e12 * 16384) == pytest.approx(6.74, rel=0.01)


def test_the_500w_h100_is_its_own_gpu_never_the_700w_one():
    label = "H100 96GB HBM2e SXM, 500W power limit (Grand Teton)"
    base = load_catalog()
    spec = base.get("H100-SXM")
    capped = spec.model_copy(update={"name": "H100-test-500W", "aliases": (), "tdp_w": 500.0})
    without = Catalog({k: g for k, g in base.gpus.items() if not ("H100" in g.name and g.tdp_w == 500)}, base.date)
    with_capped = Catalog({**without.gpus, capped.name: capped}, base.date)
    assert modern.catalog_gpu(label, with_capped) == "H100-test-500W"
    assert modern.catalog_gpu(label, base) == "H100-SXM-96GB-500W"  # the package catalog's own entry
    with pytest.raises(modern.NotExpressibleError, match="500 W"):
        modern.catalog_gpu(label, without)
    assert modern.catalog_gpu("H100-80GB SXM (700W)", base) == "H100-SXM"


def test_metrics_fields_and_conventions(run):
    result, _ = run
    for s in modern.SET_NAMES:
        r = result[s]
        assert {"n", "mape", "max_abs_error", "kendall_tau", "held_out", "calibration", "convention",
                "not_expressible", "does_not_fit", "per_gpu_dtype"} <= set(r)
        assert r["convention"]
    assert "dense_cp1" in result["dgxc_h100"]


#: Done-when targets (issues 13 / 14) where met, else the figure reached + a small margin (regression guards).
#: Reached 2026-11-23 23:20 UTC (causal flash, nodes, FSDP2; fitted H100-SXM 0.736 / GB200 0.571; no FP8, CP, EP):
#: dgxc_h100 dense CP-1 bf16 MAPE 3.9 % (target 10 % met), max 12.2 %, tau 0.53 (target 0.8 not met: GPT-3 VP 6 vs
#: 12 ranked wrong, a per-p2p-call pipeline cost is missing); dgxc_gb200 MAPE 1.1 %; torchtitan MAPE 28.7 %
#: (target 12 %: FSDP2 eager-mode framework gap, also on A100); llama3_405b max 20.2 % (target 10 %);
#: megatron_lm_h100 MAPE 17.7 %, max 35.1 % (target 10 %: TP-comm and DP overlap). docs/estimator.md, Modern sets.
BOUNDS = {
    # With plan.cp / plan.ep (helper moe) the CP and MoE/EP rows became expressible, not yet calibrated: dgxc_h100
    # max 17.1 % (CP 2 / Grok-1 EP rows; dense CP-1 subset unchanged, MAPE 3.9 %); dgxc_gb200 MAPE 18.4 % from the
    # MoE rows (DeepSeek-V3 EP 32-64 on NVL72 -67 %, Grok-1 +24 %, Llama 4 Maverick -13 %; dense and CP rows -4 %).
    # The p2p call of an interleaved pipeline's extra chunks (0.98 ms, fitted on GPT-3 VP 6 vs 12), TP communication
    # overlapped as the recipes enable it and H100 / GB200 refitted (bf16 0.671 / 0.518, fp8 0.614 / 0.444): dgxc_h100
    # dense CP-1 bf16 + fp8 MAPE 5.4 %, tau 0.92 (all rows 0.80; target 0.8 met), max 35 % (a Grok-1 EP row whose
    # twin configuration is at -5 %);
    # llama3_405b max 20 -> 8.8 % (target 10 % met); megatron_lm_h100 MAPE 17.7 -> 9.3 %, max 35 -> 22 % (also the
    # parameter all-gather behind the next forward, --overlap-param-gather).
    # With dtype fp8 (helper fp8) the FP8 rows became expressible (dense CP-1 bf16 and fp8 together below).
    "dgxc_h100": {"mape": 0.10, "max_abs_error": 0.36, "kendall_tau": 0.8},
    # dgxc_gb200: the Grok-1 rows run expert-TP 4 (their notes' ETP=4), whose token all-gathers make them 31 %
    # too slow (24 % before), and they now fit (139 of 173 GiB; 253 GiB at expert-TP 1).
    # Then Grok-1 GB200's CUDA graphs (14.87 -> 14.78 %) and DeepSeek-V3's unfused MLA attention on Blackwell with
    # its recipe's core-attention recomputation (-63 -> -49 %): 13.47 %, max 49.2 %.
    "dgxc_gb200": {"mape": 0.14, "max_abs_error": 0.50},
    # torchtitan: per-op SAC, the eager fp32 loss (memory within 8.3 % on every row with memory, target met) and the
    # 500 W H100 by power-cap physics (0.578): bf16 MAPE 26.6 -> 18 %, with the FP8 rows 20.4 %; eager PyTorch's
    # unfused element-wise ops on the rows without torch.compile (Job.torch_compile, hetplan.estimate.elementwise:
    # eager 8B rows +29 / +32 -> +10 / +13 %, A100 rows +12..20 -> +7..10 %) and per-op SAC's recomputed TP
    # all-gathers: 17.5 %; the 500 W part's FP8 GEMMs by the same power-cap physics (0.614 x 0.861 = 0.529): 16.2 %;
    # DTensor's sequence-dim copies around each TP collective: 15.1 %; with the memory helper's mappings (H200
    # rows' per-op SAC, fp32 loss before 2025-04, also charged in time): 13.1 %; the Llama 4 Scout MoE rows at the
    # local batch 1 they ran (modern.TORCHTITAN_LOCAL_BATCH; +46 / +66 % -> +28 / +42 %) with torch._grouped_mm's
    # Blackwell ceiling (moe.TORCH_GROUPED_MM_BLACKWELL; -> +15 / +28 %): 10.8 %, target 12 % met (the H200 rows
    # +26 / +27 %); the H200 rows at the FlashAttention-2 rates of their SDPA backend (+12 / +13 %): 9.8 %; torchao's
    # backward float8 work (recast input, transposed copies; shard casts under TP): 9.6 % (8.9 % after the K½ refit)
    "torchtitan": {"mape": 0.12},
    "llama3_405b": {"max_abs_error": 0.10},
    # megatron_lm_h100: untied embeddings (the README's sizes), the unfused cross-entropy (r0.8.0's default) and the
    # PP-1 rows as one micro-batch per DP rank: MAPE 9.2 -> 8.1 %, max 22.2 -> 20.6 % (the 1.7B row, +21 %; 7.1B
    # +17 %; every row from 16B up within 10 %). The reduction's K½ following the machine balance (H100 259 / 517 FP8,
    # e_max refitted 0.686 / 0.645): MAPE 8.1 -> 7.7 %, max 20.6 -> 18.8 % (1.7B; 7.1B +16.5 %).
    # Causal kernels at their causal rate (compute.flash_attention_time_s; e_max refitted 0.691 / 0.652): MAPE
    # 7.7 -> 7.4 %, max 18.8 -> 18.0 % (1.7B; 7.1B +16.2 %).
    "megatron_lm_h100": {"mape": 0.08, "max_abs_error": 0.195},
    # moe_h100 (target 15 % met): 14.7 % MAPE on 22 rows, max 34 %, with the sources' own FLOP count
    # (Megatron's causal half for the ModelZoo TFLOP/s), AutoModel's activation checkpointing as full recompute,
    # the GPT-OSS recipes' EP, DeepEP's one copy per node and rank, TE's per-expert GEMM launches and
    # --recompute-modules moe, CUDA graphs (no host floor) and the 1F1B all-to-all overlap where the rows run
    # them. The NeMo AutoModel rows (PyTorch FSDP2 eager) stay 4-34 % too fast.
    # With Megatron-Bridge's 12 DGX-H100 rows (GPT-OSS 120B, Qwen3-30B-A3B, Qwen3-235B-A22B) and the token
    # permutation, random routing's spread and TE's 4-stream expert GEMMs (issue 28): 34 rows, MAPE 14.0 %, max 31.3 %.
    "moe_h100": {"mape": 0.15, "max_abs_error": 0.35},
    # long_context_cp (target 15 % met): 7.1 % on 16 rows once FP8 landed (47.9 % before torchtitan's CP rows ran
    # without causal load balancing and NeMo 24.03's H100 rows with FlashAttention-2); Llama 3's 128K row +55 %.
    "long_context_cp": {"mape": 0.08},
}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_accuracy(run, name):
    r = run[0][name]
    assert r["n"] > 0
    subset = modern.TARGETS.get(name, {}).get("subset")
    if subset:
        assert r[subset]["mape"] <= modern.TARGETS[name]["mape"], (name, subset, r[subset]["mape"])
    for k, bound in BOUNDS[name].items():
        if k == "kendall_tau":
            assert r[k] >= bound, (name, k, r[k])
        else:
            assert r[k] <= bound, (name, k, r[k])


def test_expressible_rows_fit_in_memory(run):
    """Issue 13: no false "does not fit" on a configuration that ran. Not met yet: the rows listed in
    :data:`NOT_FITTING_YET` are predicted above their GPU's memory; the test fails on any other row. (The DGX Cloud
    rows at small DP fit since the gradient buffer follows the recipes' bf16 gradient reduction.)"""
    _, cases = run
    bad = {c.key.split(":", 2)[0] + ":" + c.info["model"] + f":n{c.info['n']}" for c in cases if not c.fits}
    assert bad <= NOT_FITTING_YET, sorted(bad - NOT_FITTING_YET)


NOT_FITTING_YET = {
    # (Nemotron-4 340B on 128 GPUs, 84.9 GiB at CP 1 x DP 2, fits at 71.2 GiB: its launch script ran bf16 with CP 2,
    # modern.DGXC_LAUNCH_CP.) Llama 3 405B on 8,192 GPUs, 82.4 GiB on the second stage: with one layer per model
    # chunk (v = 8; the paper's first chunk holds only the embedding) and Megatron's N = PP = 16 contiguous
    # micro-batches, its warm-up keeps (v-1)·N + 2·(p-2) + 1 = 141 chunks = 17.6 micro-batches x 8 layers of 533 MB
    # (TP 8 + SP, no recomputation) = 70 GiB of activations. The paper (Sec. 3.3.2, Fig. 6) makes N tunable
    # "between DFS (N = PP) and BFS (N = M)", so N = PP = 16 is its smallest warm-up: no N it describes fits. The
    # 82.4 GiB hold 2.8 GiB more than the 79.6 GiB of an H100, less than the stated 1 GiB CUDA context + 5 %
    # allocator margin (5.1 GiB) that the paper's "proactive deallocation based on detailed memory allocation
    # profiling" may have beaten; not changed without a measurement.
    "llama3_405b:Llama 3 405B:n8192",
    # (Llama 4 Scout on 256 GB200 fits at the local batch 1 of its first write-up, modern.TORCHTITAN_LOCAL_BATCH.)
    # (The ModelZoo's MXFP8 GB200 row fits at 91 GiB of 173 with the activation offloading and the moe_act +
    # layernorm recompute modules its command runs, Job.offload_modules / recompute_modules: 216 GiB without.)
}


#: torchtitan rows (by row index) whose memory is not within the issue's +-10 % yet, with the error reached as
#: their bound (docs/estimator.md, Modern sets), both predicted low: the 405B PP 8 row under 1F1B at 8K tokens
#: (-17.1 %, 10 GiB above its interleaved twin, which is within 2 %) and the 4-D row at CP 8 (-17.0 %; the 4-D
#: rows grow with CP faster than the all-gathered K/V explain). Before PyTorch's pipeline buffers and kept
#: outputs, its TP's all-gathered inputs, the eager loss's allocator hole, the CUDA context left out of the
#: reserved bytes, torchtitan's widened K/V and the CP all-gather buffer: {10: -13.4, 12: -21.0, 14: -13.4,
#: 15: -14.1, 16: -15.4, 17: -23.2} %.
TORCHTITAN_MEMORY_NOT_YET = {12: 0.18, 17: 0.18}


def test_torchtitan_memory_within_ten_percent_on_every_row(run):
    """Issue 13: torchtitan's memory per GPU (``reserved_bytes.all.peak``: the allocator's reserved bytes, compared
    with the estimate less the CUDA context) within +-10 % on every row that gives memory (per-op SAC, FSDP2's
    sharded fp32 states, a pipeline stage's unsharded units and accumulated gradients, PyTorch's pipeline buffers
    and its TP's all-gathered inputs, the loss eager or compiled as the commit ran it); the rows of
    :data:`TORCHTITAN_MEMORY_NOT_YET` within the error reached so far, every one still predicted low."""
    from hetplan.estimate import memory
    from hetplan.estimate.estimator import estimate

    _, cases = run
    rows = [c for c in cases if c.key.split(":")[0] in ("torchtitan", "long_context_cp") and c.measured_memory_bytes]
    assert len(rows) == 24  # with the four GB200 rows of the chunked loss (test_chunked_loss_holds_one_chunks_logits)
    one = rows[0]
    est = estimate(one.plan, model=one.model, virtual_stages=one.virtual_stages)
    assert one.predicted_memory_bytes == max(s.memory.total - s.memory.context for s in est.stages)
    assert est.stages[0].memory.context == memory.CUDA_CONTEXT_LAZY_BYTES  # torchtitan: lazy module loading
    for c in rows:
        if int(c.key.split(":")[1]) in TORCHTITAN_MEMORY_NOT_YET:
            assert c.predicted_memory_bytes < c.measured_memory_bytes, c.key
    for c in rows:
        bound = TORCHTITAN_MEMORY_NOT_YET.get(int(c.key.split(":")[1]), modern.TARGETS["torchtitan"][
            "memory_max_abs_error"])
        assert abs(c.predicted_memory_bytes / c.measured_memory_bytes - 1) <= bound, c.key


def test_calibration_split_is_seeded_and_partial(run):
    _, cases = run
    cal = [c for c in cases if c.is_calibration]
    assert 0 < len(cal) < len(cases)
    again = modern.load_sets(["dgxc_h100"])["dgxc_h100"][0]
    assert [c.is_calibration for c in again] == [c.is_calibration for c in cases if c.set == "dgxc_h100"]


def test_fit_recovers_a_known_efficiency_and_mutates_nothing():
    """Brute force on a small set: rows whose 'measured' values are the predictions at e_max 0.6 give back 0.6;
    the package catalog is untouched (the fit returns data)."""
    from hetplan.calibration import modern_fit

    base = load_catalog()
    before = base.get("H100-SXM").compute_efficiency
    truth = modern_fit.catalog_with([modern_fit.EfficiencyFit("H100-SXM", "bf16", "compute_efficiency", 0.6, before,
                                                              0, 0, {}, {})], base)
    cases = modern.load_sets(["megatron_lm_h100"])["megatron_lm_h100"][0]
    for c in cases:
        c.measured = c.evaluate(truth)
        c.is_calibration = True
    fit = modern_fit.fit_gpu_dtype(cases, "H100-SXM", "bf16", base)
    assert fit.value == pytest.approx(0.6, abs=0.002)
    assert fit.was == before and fit.n_calibration == len(cases)
    assert load_catalog().get("H100-SXM").compute_efficiency == before
    assert modern_fit.efficiency_field("bf16") == "compute_efficiency"


@pytest.mark.parametrize("name,total_b,active_b", [("Grok-1 314B (MoE)", 314, 86), ("Llama 4 Maverick 400B (MoE)", 400, 17)])
def test_moe_models_without_preset_have_their_published_size(name, total_b, active_b):
    """Grok-1 (xAI: 314B, 25 % of the weights active per token) and Llama 4 Maverick (Meta: 400B total, 17B
    active) built from :data:`hetplan.calibration.modern.MOE_CONFIGS`."""
    m = modern.moe_model({"model": name, "layers": ""})
    assert counts.total_parameters(m) / 1e9 == pytest.approx(total_b, rel=0.01)
    assert counts.active_parameters(m) / 1e9 == pytest.approx(active_b, rel=0.03)


def test_fp8_rows_are_predicted_and_reported_apart(run):
    """FP8 rows are expressible (dtype = "fp8") and reported apart from bf16: the dense CP-1 subset of dgxc_h100
    meets the issue's 10 % for each dtype; every set with both dtypes reports them apart; torchtitan's four
    "float8 rowwise" rows run torchao's rowwise recipe (``Job.fp8_recipe``)."""
    result, cases = run
    r = result["dgxc_h100"]
    assert set(r["dense_cp1_per_dtype"]) == {"bf16", "fp8"}
    for d in ("bf16", "fp8"):
        assert r["dense_cp1_per_dtype"][d]["n"] > 40
        assert r["dense_cp1_per_dtype"][d]["mape"] <= 0.10, (d, r["dense_cp1_per_dtype"][d])
    assert r["dense_cp1"]["kendall_tau"] >= 0.8
    assert {"bf16", "fp8"} <= set(result["torchtitan"]["per_dtype"])
    reasons = [x["reason"] for x in result["torchtitan"]["not_expressible"]["rows"]]
    assert not any("row-wise" in x for x in reasons)  # torchao's rowwise recipe is priced (hetplan.estimate.fp8)
    rowwise = [c for c in cases if "float8 rowwise" in c.key]
    assert len(rowwise) == 4 and all(c.plan.job.fp8_recipe == "rowwise" for c in rowwise)


def test_fp8_efficiency_fit_reproduces_the_catalog_and_holds_out():
    """The FP8 GEMM efficiency of H100-SXM, fitted on the seeded 25 % of the dense CP-1 FP8 rows of the modern
    sets (:func:`hetplan.calibration.modern_fit.fit_cases`: 9 rows) under the model it was fitted in (before a
    stage waited for its slowest GPU: speed variability 0), is the catalog's 0.643, and the 48 held-out rows stay
    within 8 % MAPE. Refitted with the slowest-GPU term it would rise (0.682), but its held-out rows would get
    worse (4.5 -> 5.3 %): why the catalog keeps it (docs/estimator.md, The slowest GPU)."""
    from hetplan.calibration import modern_fit

    cat = load_catalog()
    before = modern_fit.with_every_gpu(cat, "speed_variability", 0.0)
    fit = modern_fit.fit_gpu_dtype(modern_fit.fit_cases(catalog=before), "H100-SXM", "fp8", before)
    assert fit.field == "fp8_compute_efficiency"
    assert fit.value == pytest.approx(cat.get("H100-SXM").fp8_compute_efficiency, abs=0.002)
    assert fit.n_calibration >= 5 and fit.n_held_out >= 30
    assert fit.held_out_after["mape"] <= 0.08
    refit = modern_fit.fit_gpu_dtype(modern_fit.fit_cases(catalog=cat), "H100-SXM", "fp8", cat)
    assert refit.value > fit.value and refit.held_out_after["mape"] > refit.held_out_before["mape"]


def test_dropless_imbalance_fit_reproduces_the_fact_and_predicts_each_left_out_pair():
    """The Megatron MoE ModelZoo measured Qwen3-235B-A22B at four sequence lengths (16K-128K tokens, TP 4, EP 8,
    4,096 tokens per rank) twice: forced-balance routing and the loaded checkpoint's learned router (dropless). The
    busiest EP rank's load under that router, fitted on the throughput ratios of the pairs, is run_facts.toml's
    value; each pair left out of its own fit is predicted within 1 % (10.9 % with the default 1.25), and the
    fitted pairs agree with one value (one physical property of the router, not a per-row factor)."""
    from hetplan.calibration import modern_fit
    from hetplan.calibration.modern.moe import MODELZOO_DROPLESS_IMBALANCE
    from hetplan.estimate.moe import DEFAULT_LOAD_IMBALANCE

    cases = modern.load_sets(["moe_h100"])["moe_h100"][0]
    pairs = modern_fit.dropless_pairs(cases)
    assert len(pairs) == 4 and {f.info["seq"] for f, _ in pairs} == {16384, 32768, 65536, 131072}
    assert all(f.measured > d.measured for f, d in pairs)  # TFLOP/s: the dropless run is slower
    fit = modern_fit.fit_dropless_imbalance(cases)
    assert fit.imbalance == pytest.approx(MODELZOO_DROPLESS_IMBALANCE, abs=0.01)
    assert fit.imbalance > DEFAULT_LOAD_IMBALANCE
    assert fit.left_out_after < 0.01 < 0.1 < fit.left_out_before
    # each pair alone asks for nearly the same value
    each = [modern_fit._fit_imbalance([p]) for p in pairs]
    assert max(each) - min(each) < 0.1


def test_core_align8_fit_reproduces_the_catalog_and_holds_out_fasop():
    """The A100's slowdown of the 8-byte-aligned attention core, fitted on BLOOM's four 128-head layouts of hidden
    13,824 (d = 108), is the catalog's; those rows go from 24-33 % too fast to within 5 %, and FASOP's held-out
    A100 GPT-2 XL layer at TP 1 (d = 100: another stack, model and year) from 22 % to under 8 % too fast, the TP 2
    and TP 4 layers (smaller attention share) no worse."""
    from hetplan.calibration import modern_fit

    cases = modern.load_sets(["bigscience_a100"])["bigscience_a100"][0]
    fit = modern_fit.fit_core_align8(cases)
    assert len(fit.rows) == 4 and all("h13824a128" in k for k in fit.rows)
    assert fit.value == pytest.approx(load_catalog().get("A100-SXM-80GB").core_align8_slowdown, abs=0.1)
    rows = [c for c in cases if c.key in fit.rows]
    assert all(abs(c.measured / c.predicted - 1) < 0.05 for c in rows)  # TFLOP/s, evaluated with the catalog
    held = fit.held_out
    assert len(held) == 3
    tp1 = held["fasop:gpt2XL:A100-SXM-40GB:tp1"]
    assert tp1[0] > 0.2 and abs(tp1[1]) < 0.08
    assert all(abs(after) <= abs(before) + 0.002 for before, after in held.values())


def test_megatron_lm_gpt_family_has_the_published_sizes_with_untied_embeddings():
    """The Megatron-LM README's parameter counts (1.7B ... 462B) are those of its GPT shapes with separate input and
    output embeddings (V = 131,072): within 3.5 % on every row (the table rounds 1.75 to 1.7), while one shared table
    misses the 1.7B by 13 %."""
    rows = [r for r in _file_rows(modern.FILES["megatron_lm_h100"]) if r["tp"]]
    assert len(rows) == 9
    for r in rows:
        m = modern.megatron_lm_model(r)
        assert not m.tied_embeddings
        assert counts.total_parameters(m) / 1e9 == pytest.approx(float(r["params_b"]), rel=0.035), r["model"]
    tied = modern.row_model(rows[0])
    assert counts.total_parameters(tied) / 1e9 < 0.88 * float(rows[0]["params_b"])


def test_megatron_lm_micro_batch_one_cannot_give_the_measured_32b_time():
    """The README states no micro-batch. PP-1 rows run each DP rank's sequences as one micro-batch, PP > 1 rows
    micro-batch 1 (:func:`hetplan.calibration.modern.megatron_lm_layout`). The reason, asserted: at micro-batch 1
    the 32B row (TP 8, DP 48, 4 sequences per rank) exposes most of its fp32 gradient reduce-scatter and parameter
    all-gather (one micro-batch of compute to hide behind), and its predicted iteration is over 25 % longer than
    the measured one; as one micro-batch it is within 10 %."""
    from hetplan.estimate.estimator import estimate

    rows = [r for r in _file_rows(modern.FILES["megatron_lm_h100"]) if r["tp"]]
    for r in rows:
        lay = modern.megatron_lm_layout(r)
        assert lay.mbs == (1 if lay.pp > 1 else lay.gbs // lay.dp)
    r32 = next(r for r in rows if r["params_b"] == "32.0")
    m = modern.megatron_lm_model(r32)
    flops = counts.model_flops_per_iteration(m, float(r32["global_batch"]), float(r32["seq_len"]))
    measured_s = flops / (float(r32["tflops_per_gpu"]) * 1e12 * int(r32["num_gpus"]))
    lay = modern.megatron_lm_layout(r32)
    one = dataclasses.replace(lay, plan={**lay.plan, "mbs": 1})
    t = {}
    for name, layout in (("split", one), ("whole", lay)):
        c = modern.row_case("megatron_lm_h100", name, r32, layout, "tflops_per_gpu", 1.0, catalog=load_catalog(),
                         model=m)
        est = estimate(c.plan, model=m)
        t[name] = (est.iteration_time_s, est.dp_exposed_time_s)
    assert t["split"][0] > 1.25 * measured_s and t["split"][1] > 0.25
    assert t["whole"][0] == pytest.approx(measured_s, rel=0.10) and t["whole"][1] < 0.15


def test_gpt_oss_20b_has_its_published_size():
    """openai/gpt-oss-20b model card: 20.91B parameters, 3.61B active (OpenAI leaves the input embedding out)."""
    m = modern.moe_model({"model": "GPT-OSS 20B", "layers": ""})
    assert counts.total_parameters(m) / 1e9 == pytest.approx(20.91, rel=0.005)
    assert counts.active_parameters(m, input_embedding=False) / 1e9 == pytest.approx(3.61, rel=0.02)


def test_torchtitan_compile_speedup_is_the_eager_elementwise_work(run):
    """torchtitan's Table 1 / Table 3 pairs (Llama 3.1 8B, FSDP on 8 and 128 GPUs, the same run with and without
    torch.compile: 1.157x / 1.162x measured): the predicted speedup, which comes from the eager element-wise ops
    alone (hetplan.estimate.elementwise), is within 3 % of the measured one."""
    _, cases = run
    titan = {int(c.key.split(":")[1]): c for c in cases if c.set == "torchtitan"}
    for eager, compiled in ((0, 1), (7, 8)):
        e, c = titan[eager], titan[compiled]
        assert not e.plan.job.torch_compile and c.plan.job.torch_compile
        measured, predicted = c.measured / e.measured, c.predicted / e.predicted
        assert measured == pytest.approx(predicted, rel=0.03), (eager, measured, predicted)


def test_rows_map_the_recipe_as_it_ran(run):
    """Mapping facts read from the runs' sources: the Llama 4 Scout GB200 rows run local batch 1 (pytorch/ao's
    first write-up; 8,192 tokens per GPU, global batch 256) and fit; the DGX Cloud Grok-1 rows capture CUDA graphs
    on GB200 only (grok1/launch.sh); the loss and the recomputed modules as each launch configured them
    (run_facts.toml)."""
    _, cases = run
    scout = [c for c in cases if "Scout" in c.key]
    assert len(scout) == 2
    for c in scout:
        assert (c.plan.mbs, c.plan.job.global_batch, c.plan.num_gpus) == (1, 256, 256)
        assert c.fits
    grok = [c for c in cases if c.key.startswith("dgxc") and "Grok" in c.key]
    assert {c.plan.cuda_graphs for c in grok if c.gpu == "GB200"} == {True}
    assert {c.plan.cuda_graphs for c in grok if c.gpu != "GB200"} == {False}
    # the NeMo 1.x YAML runs of Grok-1 and GPT-3 175B leave the fused loss off (their configs have no
    # cross_entropy_loss_fusion); the Llama 3.1 YAMLs of the same releases and the NeMo 2 recipes fuse it
    sources = [r["source"] for r in _file_rows(modern.FILES["dgxc_h100"])]
    dgxc = [(c, sources[int(c.key.split(":")[1])]) for c in cases if c.key.startswith("dgxc")]
    yaml_runs = [c for c, src in dgxc if ("Grok" in c.key or "GPT-3" in c.key) and "/README_" in src]
    assert len(yaml_runs) == 56 and {c.plan.cross_entropy for c in yaml_runs} == {"fp32"}
    assert {c.plan.cross_entropy for c, src in dgxc if "Llama 3.1" in c.key or "60d6fd33" in src} == {None}
    # NVTE_FUSED_ATTN=0 in the launch (Grok-1 of two releases, Nemotron-4 340B and GPT-3 of one each): FlashAttention-2
    fa2 = [c for c, src in dgxc if c.plan.job.attention_kernel == "fa2"]
    assert len(fa2) == 18 + 18 + 10 + 10 and {c.plan.job.attention_kernel for c, src in dgxc
                                              if "Llama 3.1" in c.key} == {None}
    # and DeepSeek-V3 recomputes MLA's up-projections on H100 (RM='mla_up_proj'), the core attention on GB200
    dsv3 = {c.gpu: c.plan for c, _ in dgxc if "DeepSeek" in c.key}
    assert dsv3["H100-SXM"].job.recompute_modules == ["mla_up_proj"]
    assert dsv3["GB200"].job.recompute_modules == [] and dsv3["GB200"].stages[0].recompute == "selective"
    # the Grok-1 YAMLs set no expert-TP, so NeMo's default (the TP degree) ran; the NeMo 2 recipe's rows say ETP=n
    grok_etp = {(src.split("@")[1][:8], c.gpu, c.plan.expert_tp) for c, src in dgxc if "Grok" in c.key}
    assert grok_etp == {("e6afea3a", "H100-SXM", 4), ("85380ffe", "H100-SXM", 4), ("60d6fd33", "H100-SXM", 1),
                        ("60d6fd33", "GB200", 4)}


#: torchtitan's published async-TP / vanilla-TP pairs (row indices: vanilla, async), the same job otherwise.
ASYNC_TP_PAIRS = ((10, 11), (18, 19), (20, 21), (24, 25), (26, 27), (33, 34))


def test_async_tp_model_against_the_published_pairs(run):
    """PyTorch's async TP as modelled (``Job.async_tp``) on each published async / vanilla pair: faster than the
    vanilla twin, by more than the runs measured (1.045-1.164x) but by at most 0.15 more — the stated residual
    that keeps the async rows mapped as vanilla TP (``modern.ASYNC_TP_NOTE``)."""
    from hetplan.estimate.estimator import estimate

    _, cases = run
    titan = {int(c.key.split(":")[1]): c for c in cases if c.set == "torchtitan"}
    for vanilla, fused in ASYNC_TP_PAIRS:
        v, a = titan[vanilla], titan[fused]
        assert modern.ASYNC_TP_NOTE in a.notes and modern.ASYNC_TP_NOTE not in v.notes
        plan = a.plan.model_copy(update={"job": a.plan.job.model_copy(update={"async_tp": True})})
        est = estimate(plan, model=a.model, virtual_stages=a.virtual_stages)
        measured = a.measured / v.measured
        predicted = modern.quantity_of(est, a.quantity, plan, a.model) / v.predicted
        assert measured < predicted <= measured + 0.15, (vanilla, fused, measured, predicted)


def test_mla_runs_unfused_on_blackwell_and_needs_its_core_attention_recompute(run):
    """Transformer Engine v2.1-v2.4 have no fused attention for MLA (192 / 128 head dims) on Blackwell: the DGX
    Cloud DeepSeek-V3 GB200 rows run standard attention with the core attention recomputed (their launch script's
    core_attn) and fit; without the recomputation their s x s scores would not fit. Hopper and non-MLA models keep
    FlashAttention."""
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware.catalog import load_catalog
    from hetplan.model.spec import load_model

    cat = load_catalog()
    dsv3, llama = load_model("deepseek-v3"), load_model("llama3-405b")
    assert modern.unfused_mla_on_blackwell(dsv3, cat.get("GB200"))
    assert modern.unfused_mla_on_blackwell(dsv3, cat.get("B200"))
    assert not modern.unfused_mla_on_blackwell(dsv3, cat.get("H100-SXM"))
    assert not modern.unfused_mla_on_blackwell(llama, cat.get("GB200"))
    _, cases = run
    rows = [c for c in cases if c.key.startswith("dgxc") and "DeepSeek" in c.key]
    gb200 = [c for c in rows if c.gpu == "GB200"]
    assert len(gb200) == 3 and all(c.fits for c in gb200)
    for c in gb200:
        assert c.plan.job.attention == "standard" and {s.recompute for s in c.plan.stages} == {"selective"}
        bare = c.plan.model_copy(update={"stages": [s.model_copy(update={"recompute": "none"}) for s in c.plan.stages]})
        assert not estimate(bare, model=c.model, virtual_stages=c.virtual_stages).fits
    assert {c.plan.job.attention for c in rows if c.gpu != "GB200"} == {"flash"}


def test_torchtitan_rows_run_the_release_of_their_commit():
    """Each torchtitan row runs the stack release in force when its commit ran (run_facts ``[[torchtitan.release]]``):
    the December 2024 benchmark (9dec370) a foreach AdamW, 80 B per parameter, the June 2025 ones (after
    pytorch/torchtitan#881) the fused one, 30 B — the same plan's optimizer step differs by exactly 80 / 30."""
    from hetplan.calibration.modern.torchtitan import torchtitan_cases
    from hetplan.estimate.compute import ADAM_BYTES_PER_PARAMETER, UNFUSED_ADAMW_BYTES_PER_PARAMETER
    from hetplan.estimate.estimator import estimate

    cases, _ = torchtitan_cases()
    releases = {c.plan.job.stack_spec().id for c in cases}
    # 2024-08 / 2024-12 (torchtitan@2024-06 with PP, @2024-10 with CP) and 2025-06 / 2025-08
    assert {"torchtitan@2024-06", "torchtitan@2024-10", "torchtitan@2025-05"} <= releases
    old = next(c for c in cases if c.plan.job.stack_spec().id == "torchtitan@2024-10")
    assert "adam" not in old.plan.job.stack_spec().fused
    before = {"torchtitan@2024-06", "torchtitan@2024-10"}
    assert all("adam" in c.plan.job.stack_spec().fused for c in cases if c.plan.job.stack_spec().id not in before)
    new = old.plan.model_copy(update={"job": old.plan.job.model_copy(update={"stack": "torchtitan@2025-02"})})
    ratio = estimate(old.plan, model=old.model).optimizer_time_s / estimate(new, model=old.model).optimizer_time_s
    assert ratio == pytest.approx(UNFUSED_ADAMW_BYTES_PER_PARAMETER / ADAM_BYTES_PER_PARAMETER, rel=1e-9)


def test_chunked_loss_holds_one_chunks_logits(run):
    """torchtitan 0.3.0 runs the output layer and the loss on 1/8 of the tokens at a time (``ChunkedLossWrapper``,
    StackSpec.loss_chunks): Llama 3 8B at local batch 32 x 2,048 tokens on 4 GB200 ran at 174.49 GiB reserved
    and Qwen3 8B at local batch 16 at 112.88 (torchtitan ``quantization/nvfp4.md``); the prediction is within 4 %
    of both (180.2 / 112.0) and within 5 % of their tokens/s (-4.3 / -3.0 %). The same Llama plan under the
    release before the chunked loss (torchtitan@2025-10: the eager fp32 loss on all 65,536 tokens' logits at
    once) needs 280 GiB, which no GB200 holds: it was 198 GiB, refused, before the chunking was priced."""
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware import stacks

    _, cases = run
    rows = [c for c in cases if "200M-Token Evidence" in c.key and c.dtype == "bf16"]
    assert len(rows) == 2 and all(c.plan.job.stack == "torchtitan@0.3.0" for c in rows)
    for c in rows:
        assert abs(c.predicted_memory_bytes / c.measured_memory_bytes - 1) < 0.04, c.key
        assert abs(c.predicted / c.measured - 1) < 0.05, c.key
    assert stacks.resolve_stack("torchtitan@0.3.0").loss_chunks == 8
    assert stacks.resolve_stack("torchtitan@2025-10").loss_chunks == 1
    llama = next(c for c in rows if "Llama" in c.key)
    before = llama.plan.model_copy(update={"job": llama.plan.job.model_copy(update={"stack": "torchtitan@2025-10"})})
    est = estimate(before, model=llama.model)
    assert not est.fits and est.stages[0].memory.total > 1.5 * llama.measured_memory_bytes


def test_torchao_mxfp8_linear_on_gb200(run):
    """torchtitan's MXFP8LinearConverter (torchao ``MXFP8Linear``: six casts per linear and micro-batch, each 3 B
    plus a scale byte per 32, bf16 communication; :mod:`hetplan.estimate.fp8`) against its runs beside the bf16
    ones on 4 GB200 (``quantization/nvfp4.md``): Llama 3 8B 28,084 tokens/s per GPU, Qwen3 8B 27,587 — predicted
    within 5 % (+3.8 / +0.4 %) and their measured speed-ups over bf16 (1.28 / 1.32) within 10 % (1.39 / 1.37);
    memory within 4 % (the activations are saved in bf16 as without MXFP8)."""
    _, cases = run
    rows = {(c.model.name.split("-")[0], c.dtype): c for c in cases if "200M-Token Evidence" in c.key}
    assert len(rows) == 4
    for name in ("llama", "qwen3"):
        key = next(k for k in rows if k[0].startswith(name) and k[1] == "fp8")
        mx, bf = rows[key], rows[(key[0], "bf16")]
        assert mx.plan.job.fp8_recipe == "mxfp8"
        assert abs(mx.predicted / mx.measured - 1) < 0.05, mx.key
        assert abs(mx.predicted_memory_bytes / mx.measured_memory_bytes - 1) < 0.04, mx.key
        assert mx.predicted / bf.predicted == pytest.approx(mx.measured / bf.measured, rel=0.10)


def test_megatron_bridge_rows_run_their_recipes_and_gb300_is_priced_slow(run):
    """Megatron-Bridge's FP8 Llama rows (set ``megatron_bridge``, held out of every fit): each row is predicted with
    the FP8 recipe its table names (FP8-CS: current scaling; FP8-MX: MXFP8), CUDA graphs on the 8B rows (their
    recipes' ``cuda_graph_impl local``), no recomputation, and every plan fits. The H100 / B200 / GB200 rows are
    within 12 % (signed median within 5 %). GB300's catalog entry borrows GB200's efficiencies, and its rows run
    20-26 % faster than priced (docs/estimator.md, Modern sets): asserted, so that modelling Blackwell Ultra shows
    here as a change to state."""
    result, cases = run
    rows = _file_rows(modern.FILES["megatron_bridge"])
    assert result["megatron_bridge"]["n"] == len(rows) == 20 and result["megatron_bridge"]["not_expressible"]["n"] == 0
    bridge = [c for c in cases if c.set == "megatron_bridge"]
    for c in bridge:
        assert c.fits, c.key
        assert c.plan.job.fp8_recipe == ("mxfp8" if ":FP8-MX:" in c.key else "current"), c.key
        assert c.plan.cuda_graphs == (":Llama 3 8B:" in c.key), c.key
        assert {st.recompute for st in c.plan.stages} == {"none"}
    err = {c.key: c.measured / c.predicted - 1 for c in bridge}  # speed: + = predicted too fast
    rest = sorted(e for k, e in err.items() if ":GB300:" not in k)
    assert max(abs(e) for e in rest) <= 0.12 and abs(rest[len(rest) // 2]) <= 0.05, err
    assert all(-0.30 <= e <= -0.15 for k, e in err.items() if ":GB300:" in k), err
