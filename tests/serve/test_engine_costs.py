"""Engine-aware serving costs (hetplan.estimate.inference with an EngineSpec): launches per decode path, weight
bytes per dtype, the KV budget in blocks, and the serving validation set."""

import pytest

from hetplan.calibration.serving import TARGET, run_serving
from hetplan.errors import HetplanError, InfeasibleError
from hetplan.estimate.compute import FLASH_FUSED_KERNELS, KERNELS_PER_LAYER_FORWARD
from hetplan.estimate.inference import (activation_peak_bytes, decode_step_time_s, kv_cache_bytes_per_worker,
                                        kv_capacity_tokens, max_num_seqs, prefill_time_s, weight_bytes_per_worker)
from hetplan.hardware.catalog import get_gpu
from hetplan.hardware.engines import get_engine
from hetplan.model.spec import load_model


def test_cuda_graph_decode_drops_the_per_kernel_launch_floor():
    m, h200 = load_model("llama3-8b"), get_gpu("H200")
    legacy = decode_step_time_s(m, h200, "bf16", 1, 1100)
    graphs = decode_step_time_s(m, h200, "bf16", 1, 1100, engine=get_engine("vllm"))
    eager = decode_step_time_s(m, h200, "bf16", 1, 1100, engine=get_engine("hf-eager"))
    # eager: 15 host launches per flash layer x 32 layers at 44.3 us, ~21 ms; a graph replay: weights / HBM, ~4 ms
    assert legacy > 0.020 and eager > 32 * (KERNELS_PER_LAYER_FORWARD - FLASH_FUSED_KERNELS) * h200.kernel_overhead_s
    weights = weight_bytes_per_worker(m, 1, 1, "bf16")[0] / h200.hbm_bandwidth_bytes_per_s
    assert weights < graphs < 1.5 * weights
    # above vLLM V1's largest capture (512) a decode step runs eagerly again
    v = get_engine("vllm")
    assert v.launches_per_kernel(600, prefill=False) and not v.launches_per_kernel(512, prefill=False)


def test_fp8_and_int4_weights():
    m, h100, a100 = load_model("llama2-7b"), get_gpu("H100-SXM"), get_gpu("A100-SXM-80GB")
    bf16 = weight_bytes_per_worker(m, 1, 1, "bf16")[0]
    fp8 = weight_bytes_per_worker(m, 1, 1, "bf16", "fp8")[0]
    int4 = weight_bytes_per_worker(m, 1, 1, "bf16", "int4")[0]
    emb_head = 2 * m.padded_vocab_size() * m.hidden_size  # parameters kept 16-bit (untied embedding + head)
    assert fp8 == pytest.approx((bf16 - 2 * emb_head) / 2 + 2 * emb_head, rel=1e-3)
    assert int4 == pytest.approx((bf16 - 2 * emb_head) / 4 + 2 * emb_head, rel=1e-3)
    v = get_engine("vllm")
    for gpu in (h100, a100):  # W8A8 on Hopper, FP8 Marlin (weight-only) on Ampere: both read half the bytes
        t16 = decode_step_time_s(m, gpu, "bf16", 1, 512, engine=v)
        t8 = decode_step_time_s(m, gpu, "bf16", 1, 512, engine=v, weights="fp8")
        t4 = decode_step_time_s(m, gpu, "bf16", 1, 512, engine=v, weights="int4")
        assert 0.5 < t8 / t16 < 0.75 and 0.25 < t4 / t16 < t8 / t16
    # weight-only gains vanish once the decode batch makes the 16-bit GEMMs compute-bound (Marlin, Sec. 4)
    big16, big4 = (decode_step_time_s(m, a100, "bf16", 256, 256 * 512, engine=v, weights=w) for w in ("bf16", "int4"))
    assert big4 == pytest.approx(big16, rel=0.02)
    # compute-bound prefill: FP8 tensor cores on Hopper only
    p16, p8 = (prefill_time_s(m, h100, "bf16", 4096, engine=v, weights=w) for w in ("bf16", "fp8"))
    assert p8 < 0.8 * p16
    a16, a8 = (prefill_time_s(m, a100, "bf16", 4096, engine=v, weights=w) for w in ("bf16", "fp8"))
    assert a8 == pytest.approx(a16, rel=0.05)
    with pytest.raises(HetplanError) as e:
        decode_step_time_s(m, get_gpu("V100-SXM-32GB"), "fp16", 1, 10, engine=get_engine("vllm@0.6"), weights="fp8")
    assert e.value.field == "quantization"


def test_kv_capacity_worked_example():
    m, a100, v = load_model("llama2-7b"), get_gpu("A100-SXM-80GB"), get_engine("vllm@0.6")
    # total budget: 0.9 x memory - weights - activations of the profile run - non-torch memory, in 16-token blocks
    weights = weight_bytes_per_worker(m, 1, 1, "bf16")[0]
    act = activation_peak_bytes(m, 1, 8192, 256, "bf16")
    assert act == 8192 * (2 * 4096 + 3 * 11008) * 2 + 256 * m.padded_vocab_size() * 4
    per_token = kv_cache_bytes_per_worker(m, 1, 1, 1, "bf16")[0]
    assert per_token == 2 * 32 * 4096 * 2  # 512 KiB
    budget = 0.9 * a100.memory_bytes - weights - act - 2**30
    want = int(budget // per_token) // 16 * 16
    assert kv_capacity_tokens(m, a100, v, dtype="bf16") == want
    assert kv_capacity_tokens(m, a100, v, dtype="bf16", kv_dtype="fp8") == int(budget // (per_token / 2)) // 16 * 16
    # sequences of 2,048 tokens: blocks / 128 blocks each, under the engine's cap of 256
    assert max_num_seqs(m, a100, v, 2048, dtype="bf16") == min(256, want // 2048)
    assert max_num_seqs(m, a100, v, 100, dtype="bf16") == 256
    # TensorRT-LLM: a fraction of the free memory
    t = get_engine("tensorrt-llm@0.6")
    free = a100.memory_bytes - weights - activation_peak_bytes(m, 1, 8192, 256, "bf16") - 2**30
    assert kv_capacity_tokens(m, a100, t, dtype="bf16") == int(0.9 * free // per_token) // 64 * 64


def test_decode_gemms_pad_rows_to_the_mma_tile():
    # a decode GEMM of b rows costs its padding to the tensor cores' MMA tile (16 rows on Ampere, 64 on Hopper),
    # not the training fit's phi(M): 1 to 16 rows on A100 cost the same compute, and batch 1 is memory-bound
    from hetplan.estimate.compute import gemm_time_s
    from hetplan.estimate.inference import mma_row_tile

    a100, h100 = get_gpu("A100-SXM-80GB"), get_gpu("H100-SXM")
    assert (mma_row_tile(a100), mma_row_tile(h100)) == (16, 64)
    one = gemm_time_s(a100, "bf16", 1, 4096, 4096, row_tile=16)
    assert one == pytest.approx(2 * 4096 * 4096 / a100.hbm_bandwidth_bytes_per_s, rel=0.01)  # weights read once
    assert gemm_time_s(a100, "bf16", 1, 4096, 4096) > one  # phi(1) = 1/135 makes it compute-bound
    flops16 = gemm_time_s(a100, "bf16", 16, 4096, 4096, row_tile=16, weight_bytes=0.0)
    assert gemm_time_s(a100, "bf16", 9, 4096, 4096, row_tile=16, weight_bytes=0.0) == pytest.approx(flops16)
    assert gemm_time_s(a100, "bf16", 17, 4096, 4096, row_tile=16, weight_bytes=0.0) > 1.9 * flops16


def test_no_room_for_the_cache_is_infeasible():
    m = load_model("llama2-70b")
    with pytest.raises(InfeasibleError) as e:
        kv_capacity_tokens(m, get_gpu("A100-SXM-80GB"), get_engine("vllm"), dtype="bf16")
    assert e.value.field == "gpu" and "TP" in e.value.fix
    assert kv_capacity_tokens(m, get_gpu("A100-SXM-80GB"), get_engine("vllm"), tp=4, dtype="bf16") > 100_000


def test_serving_validation_set():
    res = run_serving()[0]["serving"]
    assert res["n"] >= 60 and res["not_expressible"] == 0  # FP8 rows included
    assert res["held_out"]["n"] > 20 and res["calibration"]["n"] > 20
    # the engine model's error on published rows (docs/serving.md): issue 25's target 15 %, with a small margin
    # for the held-out half
    assert res["mape"] <= TARGET["mape"] + 0.01
    assert res["held_out"]["mape"] <= 0.20
    assert abs(res["signed_median"]) < 0.10 and res["max_abs_error"] < 1.0
    # issue 25 item 1: TensorRT-LLM v0.6.1's decode-heavy Llama 2 70B rows at TP 2 / 4 on H100 were 45-57 % too
    # fast with one K/V read per GQA group; with the masked MHA kernel's read per query head within 20 % (15 % at
    # hbm_efficiency 0.96; the refit 0.89 makes the K/V-read-heavy TP 4 128/2,048 row +17 %: docs/serving.md)
    rows = {r["key"]: r for r in res["rows"]}
    for key in ("trt0.6-H100-llama2-70b-b480-tp4-128/2048", "trt0.6-H100-llama2-70b-b64-tp2-2048/2048",
                "trt0.6-H100-llama2-70b-b1024-tp2-128/128"):
        assert abs(rows[key]["error"]) < 0.20, (key, rows[key]["error"])


def test_step_model_prices_the_engine():
    from hetplan.estimate.inference import step_time_s
    from hetplan.serve.exec_model import EstimatedStepModel

    m, h100, v = load_model("llama3-8b"), get_gpu("H100-SXM"), get_engine("vllm")
    sm = EstimatedStepModel(m, h100, dtype="bf16", engine=v, weights="fp8", kv_dtype="fp8")
    want = step_time_s(m, h100, "bf16", [512], [600, 600], engine=v, weights="fp8", kv_dtype="fp8")
    assert sm.step_time_s([512], [600, 600]) == pytest.approx(want)
    # the engine's step overhead once per iteration, not once per pass
    both = step_time_s(m, h100, "bf16", [512], [600], engine=v)
    alone = (prefill_time_s(m, h100, "bf16", 512, engine=v)
             + decode_step_time_s(m, h100, "bf16", 1, 600, engine=v))
    assert both == pytest.approx(alone - v.step_overhead_s)
    assert EstimatedStepModel(m, h100, dtype="bf16").step_time_s([], [600]) > 5 * sm.step_time_s([], [600])


def test_bad_capacity_inputs_name_the_field():
    m, a100 = load_model("llama2-7b"), get_gpu("A100-SXM-80GB")
    for kw, field in (({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
                      ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
                      ({"weights": "fp8", "dtype": "fp16"}, "quantization")):
        engine = get_engine("hf-eager") if field == "quantization" else get_engine("vllm")
        with pytest.raises(HetplanError) as e:
            kv_capacity_tokens(m, a100, engine, **kw)
        assert e.value.field == field
    with pytest.raises(HetplanError) as e:
        kv_capacity_tokens(m, get_gpu("V100-SXM-32GB"), get_engine("vllm@0.10"), dtype="fp16")
    assert e.value.field == "engine"
    with pytest.raises(HetplanError) as e:
        max_num_seqs(m, a100, get_engine("vllm"), 0, dtype="bf16")
    assert e.value.field == "seq_tokens"


def test_capacity_and_step_time_are_monotone():
    m, h100, v = load_model("llama3-8b"), get_gpu("H100-SXM"), get_engine("vllm")
    caps = [kv_capacity_tokens(m, h100, v, dtype="bf16", gpu_memory_utilization=u) for u in (0.5, 0.7, 0.9)]
    assert caps[0] < caps[1] < caps[2]
    assert kv_capacity_tokens(m, h100, v, dtype="bf16", kv_dtype="fp8") > 1.9 * caps[2]
    steps = [decode_step_time_s(m, h100, "bf16", b, b * 1000, engine=v) for b in (1, 8, 64, 256, 1024)]
    assert all(x <= y for x, y in zip(steps, steps[1:]))


def test_chunked_prefill_pays_attention_to_earlier_chunks():
    from hetplan.estimate.inference import chunk_context_time_s, step_time_s
    from hetplan.serve.exec_model import EstimatedStepModel

    m, h100, v = load_model("llama3-8b"), get_gpu("H100-SXM"), get_engine("vllm")
    whole = step_time_s(m, h100, "bf16", [8192], [], engine=v)
    first = step_time_s(m, h100, "bf16", [4096], [], engine=v)
    second = step_time_s(m, h100, "bf16", [4096], [], engine=v, prefill_contexts=[4096])
    # the second chunk attends to the first: more than the first, and the two chunks together do the whole
    # prompt's work (same GEMM FLOPs; causal attention 8192^2 / 2 = two 4096^2 / 2 triangles + one 4096^2 square)
    assert second > first
    assert first + second == pytest.approx(whole, rel=0.15)
    assert chunk_context_time_s(m, h100, "bf16", [4096], [0], engine=v) == 0.0
    sm = EstimatedStepModel(m, h100, dtype="bf16", engine=v)
    assert sm.step_time_s([4096], [], [4096]) == pytest.approx(second)
    assert sm.step_time_s([4096], []) == pytest.approx(first)


def test_validate_serving_table_fits_80_columns():
    import json

    from typer.testing import CliRunner

    from hetplan.cli.main import app

    r = CliRunner().invoke(app, ["validate", "--sets", "serving"], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "held-out" in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    r = CliRunner().invoke(app, ["validate", "--sets", "serving", "--json"])
    res = json.loads(r.output)
    from hetplan.calibration.serving import load_rows

    assert res["sets"]["serving"]["n"] == len(load_rows()) and "tensorrt-llm@1.0" in res["stacks"]


def test_gqa_decode_reads_per_query_head_without_xqa():
    """TensorRT-LLM 0.6's masked MHA kernel (one thread block per query head) reads a GQA group's K/V once per
    query head: Llama 2 70B (64 query / 8 key-value heads) pays 8x the K/V bytes, the MHA 7B nothing more."""
    from hetplan.estimate.inference import kv_read_time_s

    trt6, trt10 = get_engine("tensorrt-llm@0.6"), get_engine("tensorrt-llm@1.0")
    big, small = load_model("llama2-70b"), load_model("llama2-7b")
    assert trt6.decode_kv_reads(big.num_attention_heads, big.num_kv_heads) == 8
    assert trt6.decode_kv_reads(small.num_attention_heads, small.num_kv_heads) == 1
    assert trt10.decode_kv_reads(big.num_attention_heads, big.num_kv_heads) == 1
    h100 = get_gpu("H100-SXM")
    one, eight = (kv_read_time_s(big, h100, "fp16", 200_000, 2, "fp8", reads=r) for r in (1, 8))
    assert eight == pytest.approx(8 * one)  # bandwidth-bound at one query per cached token
    kw = dict(tp=2, weights="fp8", kv_dtype="fp8")
    shared = trt6.model_copy(update={"gqa_decode_kv_shared": True})
    slow, fast = (decode_step_time_s(big, h100, "fp16", 64, 64 * 3072, engine=e, **kw) for e in (trt6, shared))
    engine_h100 = h100.model_copy(update={"hbm_bandwidth_bytes_per_s": h100.hbm_bandwidth_bytes_per_s
                                          * trt6.hbm_efficiency})
    kv_s = big.num_layers * kv_read_time_s(big, engine_h100, "fp16", 64 * 3072, 2, "fp8")
    assert slow - fast == pytest.approx(7 * kv_s, rel=1e-6)


def test_tp_decode_prices_the_engines_allreduce():
    """vLLM's custom all-reduce inside the decode graph against NCCL's ring: two all-reduces per layer of
    batch x hidden bytes, latency-bound at small batches (docs/serving.md, The engine model)."""
    from hetplan.estimate.comm import ALPHA_INTRA_NODE_S, allreduce_time_s, custom_allreduce_time_s

    m, h200, v = load_model("llama3-70b"), get_gpu("H200"), get_engine("vllm@0.6")
    nccl = v.model_copy(update={"tp_allreduce": "nccl"})
    custom, ring = (decode_step_time_s(m, h200, "bf16", 8, 8 * 100, tp=4, engine=e) for e in (v, nccl))
    msg, link = 8 * m.hidden_size * 2, h200.gpu_link_bandwidth_bytes_per_s
    per_ar = (allreduce_time_s(msg, 4, link, ALPHA_INTRA_NODE_S, efficiency=0.77)
              - custom_allreduce_time_s(msg, 4, link, ALPHA_INTRA_NODE_S, efficiency=0.77))
    assert ring - custom == pytest.approx(2 * m.num_layers * per_ar, rel=1e-6)
    assert custom < ring
    # at TP 1 nothing changes
    assert (decode_step_time_s(m, h200, "fp8", 8, 800, engine=v, weights="fp8")
            == decode_step_time_s(m, h200, "fp8", 8, 800, engine=nccl, weights="fp8"))


def test_custom_allreduce_needs_a_peer_to_peer_domain():
    """vLLM runs its custom all-reduce on an NVLink/NVSwitch domain or 2 PCIe GPUs, NCCL on more PCIe GPUs."""
    from hetplan.estimate.inference import tp_allreduce_algorithm

    v, trt6, trt10 = get_engine("vllm@0.6"), get_engine("tensorrt-llm@0.6"), get_engine("tensorrt-llm@1.0")
    h100, a10g = get_gpu("H100-SXM"), get_gpu("A10G")
    assert tp_allreduce_algorithm(v, h100, 8) == "custom" and tp_allreduce_algorithm(v, a10g, 2) == "custom"
    assert tp_allreduce_algorithm(v, a10g, 4) == "ring" and tp_allreduce_algorithm(trt6, h100, 4) == "ring"
    assert tp_allreduce_algorithm(trt10, h100, 4) == "custom-auto"
    m = load_model("llama2-13b")
    nccl = v.model_copy(update={"tp_allreduce": "nccl"})
    assert (decode_step_time_s(m, a10g, "fp16", 8, 800, tp=4, engine=v)
            == decode_step_time_s(m, a10g, "fp16", 8, 800, tp=4, engine=nccl))


def test_sliding_window_layers_read_only_the_window_in_decode():
    """A window layer's decode attention reads min(context, w) tokens per sequence (every engine's kernel honours
    the window); the simulator's step model agrees with step_time_s to 1e-9 on mixed contexts, where the window
    tokens are Σ min(c, w), not n·min(mean, w)."""
    from hetplan.estimate.inference import decode_step_time_s, step_time_s, window_tokens
    from hetplan.serve.exec_model import EstimatedStepModel

    m, h100, v = load_model("gpt-oss-120b"), get_gpu("H100-SXM"), get_engine("vllm")
    full = m.model_copy(update={"sliding_window_layers": 0, "name": "gpt-oss-120b-full"})
    short = decode_step_time_s(m, h100, "bf16", 8, 8 * 100, tp=2, engine=v)
    assert short == pytest.approx(decode_step_time_s(full, h100, "bf16", 8, 8 * 100, tp=2, engine=v))  # inside w
    long_w, long_full = (decode_step_time_s(x, h100, "bf16", 8, 8 * 32768, tp=2, engine=v) for x in (m, full))
    assert long_w < long_full
    assert window_tokens(m, [100, 200, 3000]) == 100 + 128 + 128
    sm = EstimatedStepModel(m, h100, tp=2, dtype="bf16", engine=v)
    for contexts in ([100, 200, 3000, 50000], [5000] * 8, [64] * 3):
        assert sm.step_time_s([], contexts) == pytest.approx(step_time_s(m, h100, "bf16", [], contexts, tp=2, engine=v),
                                                              rel=1e-9)


def test_window_layers_hold_only_their_window_under_vllm_v1():
    """vLLM V1's hybrid KV cache manager keeps a window layer's blocks for its window alone, so GPT-OSS-120B
    (18 of 36 layers with a 128-token window) holds about half the KV blocks per long sequence and runs about
    twice the sequences; SGLang's pool (window_kv_blocks false: no shared per-window accounting modelled) and a
    model without windows are unchanged."""
    from hetplan.estimate.inference import kv_capacity_tokens, kv_layer_blocks, max_num_seqs

    m, h100, v, sg = load_model("gpt-oss-120b"), get_gpu("H100-SXM"), get_engine("vllm"), get_engine("sglang")
    assert v.window_kv_blocks and not sg.window_kv_blocks
    whole = v.model_copy(update={"window_kv_blocks": False})
    kw = dict(tp=4, dtype="bf16")
    seq = 32768
    per_seq = kv_layer_blocks(m, 16, seq, windowed=True)
    assert per_seq == 18 * (seq // 16) + 18 * (128 // 16 + 1)
    pool = kv_capacity_tokens(m, h100, v, tp=4, dtype="bf16") // 16 * m.num_layers
    assert max_num_seqs(m, h100, v, seq, **kw) == pool // per_seq
    ratio = max_num_seqs(m, h100, v, seq, **kw) / max_num_seqs(m, h100, whole, seq, **kw)
    assert 1.9 < ratio < 2.1
    dense = load_model("llama3-8b")
    assert max_num_seqs(dense, h100, v, 4096, **kw) == max_num_seqs(dense, h100, whole, 4096, **kw)


def test_mla_latent_cache_of_the_engines_that_keep_it():
    """DeepSeek-V3 (61 layers, kv_lora_rank 512, qk_rope_head_dim 64): vLLM 0.10, SGLang and TensorRT-LLM 1.0 cache
    576 latent elements per token and layer, whole on every TP rank — 70,272 bytes per token in bf16 — where the
    up-projected keys (128 heads x 192) and values (128 x 128) are 40,960 elements per layer (vLLM 0.6, hetplan's own
    engine): 71x more at TP 1, 8.9x at TP 8. Decode reads the latent once for all heads; its attention then runs
    2·(2·512 + 64) FLOPs per head and cached token, so a long decode is no longer bound by the cache reads alone."""
    from hetplan.estimate.inference import kv_elements_per_token, kv_read_time_s

    m, h200 = load_model("deepseek-v3"), get_gpu("H200-SXM")
    latent, expanded = get_engine("vllm@0.10"), get_engine("vllm@0.6")
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.num_layers) == (512, 64, 61)
    for tp in (1, 8):
        for e in (latent, get_engine("sglang@0.5"), get_engine("tensorrt-llm@1.0")):
            assert kv_elements_per_token(m, tp, e) == 576
            assert kv_cache_bytes_per_worker(m, 1, tp, 1, "bf16", e) == [61 * 576 * 2] * tp
        assert kv_elements_per_token(m, tp, expanded) == kv_elements_per_token(m, tp) == 128 * (192 + 128) // tp
    dense = load_model("llama2-7b")  # no MLA: every engine caches keys and values
    assert kv_elements_per_token(dense, 1, latent) == kv_elements_per_token(dense, 1) == 2 * 4096
    n = 100_000  # cached tokens of one decode step, TP 8
    t_lat, t_exp = (kv_read_time_s(m, h200, "bf16", n, 8, engine=e) for e in (latent, expanded))
    reads = n * 576 * 2 / h200.hbm_bandwidth_bytes_per_s
    flops = 2 * n * 16 * (2 * 512 + 64) / (h200.peak_flops_per_s("bf16") * h200.compute_efficiency)
    assert t_lat == pytest.approx(max(reads, flops))
    assert t_exp == pytest.approx(n * 128 * 320 // 8 * 2 / h200.hbm_bandwidth_bytes_per_s)
    assert t_lat < t_exp / 4
    # the KV pool of an 8 x H200 replica holds ~9x the tokens (the weights and workspace are the same)
    big = [kv_capacity_tokens(m, h200, e, tp=8, dtype="bf16", weights="fp8") for e in (latent, expanded)]
    assert 8 < big[0] / big[1] < 10


def test_engines_replicate_key_value_heads_beyond_their_count():
    """Gemma 3 4B has 4 key/value heads: at TP 8 a serving engine gives each rank one, replicated (vLLM's
    QKVParallelLinear num_kv_head_replicas), so each rank caches 512 elements per token and layer as at TP 4 and
    holds its K/V projections' whole head; hetplan's own engine, which splits the heads, refuses TP 8 (field tp).
    A TP degree the query heads do not divide stays refused (6 heads over TP 4)."""
    from hetplan.estimate.inference import check_tp, kv_elements_per_token

    m, v = load_model("gemma3-4b"), get_engine("vllm@0.10")
    assert (m.num_attention_heads, m.num_kv_heads, m.head_dim) == (8, 4, 256)
    assert kv_elements_per_token(m, 4, v) == kv_elements_per_token(m, 8, v) == 2 * 256
    assert kv_cache_bytes_per_worker(m, 10, 8, 1, "bf16", v) == [m.num_layers * 10 * 512 * 2] * 8
    w4, w8 = (weight_bytes_per_worker(m, tp, 1, "bf16", None, v)[0] for tp in (4, 8))
    kv_proj = m.num_layers * m.hidden_size * (m.kv_dim + m.v_dim) * 2  # bytes of every layer's K and V weights
    assert w8 == pytest.approx(w4 / 2 + kv_proj / 4 - kv_proj / 8, abs=m.num_layers)  # one of 4 heads, not 1/8
    h100 = get_gpu("H100-SXM")
    assert kv_capacity_tokens(m, h100, v, tp=8, dtype="bf16") > 0
    with pytest.raises(HetplanError) as e:
        check_tp(m, 8)  # hetplan's own engine splits the heads
    assert e.value.field == "tp"
    three = m.model_copy(update={"num_kv_heads": 2, "num_attention_heads": 6})
    with pytest.raises(HetplanError):
        check_tp(three, 4, v)  # 6 query heads do not split over 4 ranks
