"""Serving engines as data (hetplan.hardware.engines): every release loads with a source per field, names resolve,
and what an engine does not run on a GPU is refused naming the field."""

import pytest

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import get_gpu
from hetplan.hardware.engines import (KERNEL_RATE_CLASS, WEIGHT_DTYPE_BYTES, get_engine, load_engines,
                                      parse_batch_sizes)


def test_every_release_has_a_source_for_every_field():
    cat = load_engines()
    assert {"vllm", "sglang", "tensorrt-llm", "hf-eager"} <= set(cat.names())
    for e in cat.all():
        for field in ("decode_path", "attention", "kv_block_tokens", "gpu_memory_utilization", "step_overhead_s",
                      "weight_dtypes", "cuda_graph_batch_sizes", "memory_budget"):
            assert len(e.sources.get(field, "")) > 20, (e.label, field)
        assert set(e.weight_dtypes) <= set(WEIGHT_DTYPE_BYTES)
        assert set(e.attention.values()) <= set(KERNEL_RATE_CLASS)
        # captured sizes only on the CUDA-graph path
        assert bool(e.cuda_graph_batch_sizes) == (e.decode_path == "cuda_graphs"), e.label


def test_vllm_capture_sizes_match_the_code_rule():
    # vllm/config/compilation.py set_cudagraph_sizes (v0.10): [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)
    want = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    assert list(get_engine("vllm@0.10").cuda_graph_batch_sizes) == want
    # v0.6: [1, 2, 4] + [8 * i for i in range(1, 33)]
    assert list(get_engine("vllm@0.6").cuda_graph_batch_sizes) == [1, 2, 4] + [8 * i for i in range(1, 33)]
    assert parse_batch_sizes("3, 1, 10-20/5") == (1, 3, 10, 15, 20)
    for bad in ("0", "8-4/2", "x", "1-8/0"):
        with pytest.raises(HetplanError) as e:
            parse_batch_sizes(bad)
        assert e.value.field == "cuda_graph_batch_sizes"


def test_graph_batch_padding_and_launch_paths():
    v = get_engine("vllm@0.6")
    assert v.graph_batch_size(1) == 1 and v.graph_batch_size(3) == 4 and v.graph_batch_size(9) == 16
    assert v.graph_batch_size(257) is None  # above the largest capture: eager
    assert not v.launches_per_kernel(200, prefill=False) and v.launches_per_kernel(300, prefill=False)
    assert v.launches_per_kernel(1, prefill=True)  # v0.6 prefills eagerly
    assert not get_engine("vllm@0.10").launches_per_kernel(1, prefill=True)  # piecewise graphs
    trt = get_engine("tensorrt-llm@0.6")
    assert trt.graph_batch_size(1) is None and not trt.launches_per_kernel(4096, prefill=False)
    assert get_engine("hf-eager").launches_per_kernel(1, prefill=False)


def test_names_versions_aliases():
    assert get_engine("vllm").version == "0.10"  # newest release
    assert get_engine("vllm@0.6.3").version == "0.6"
    assert get_engine("TRTLLM").name == "tensorrt-llm" and get_engine("trtllm@0.6").decode_path == "compiled"
    assert get_engine("sglang@0.4").label == "sglang@0.4"
    with pytest.raises(HetplanError) as e:
        get_engine("vlm")
    assert e.value.field == "engine" and "vllm" in e.value.fix
    with pytest.raises(HetplanError) as e:
        get_engine("vllm@0.4")
    assert e.value.field == "engine" and "vllm@0.6" in e.value.fix


def test_weight_dtypes_per_gpu_generation():
    v = get_engine("vllm")
    a100, h100, v100 = get_gpu("A100-SXM-80GB"), get_gpu("H100-SXM"), get_gpu("V100-SXM-32GB")
    assert v.gemm_dtype("fp8", h100) == "fp8"  # W8A8 on Hopper
    assert v.gemm_dtype("fp8", a100) == "bf16"  # FP8 Marlin weight-only on Ampere
    assert v.gemm_dtype("int4", h100) == "bf16" and v.gemm_dtype("bf16", a100) == "bf16"
    with pytest.raises(HetplanError) as e:
        get_engine("vllm@0.6").check_weight_dtype("fp8", v100)
    assert e.value.field == "quantization" and "Ampere" in e.value.fix
    with pytest.raises(HetplanError) as e:
        get_engine("hf-eager").gemm_dtype("fp8", h100)
    assert e.value.field == "quantization"
    with pytest.raises(HetplanError) as e:
        v.check_weight_dtype("fp4", h100)
    assert e.value.field == "quantization"
    with pytest.raises(HetplanError) as e:
        v.attention_kernel(v100)  # vLLM V1 does not run on Volta
    assert e.value.field == "engine"
    assert v.attention_kernel(h100) == "fa3" and v.attention_rate_kernel(a100) == "fa2"


def test_default_max_num_seqs_by_gpu_memory():
    # vLLM V1: 1024 on >= 70 GiB GPUs other than A100, else 256 (tests/engine/test_arg_utils.py)
    v = get_engine("vllm@0.10")
    assert v.default_max_num_seqs(get_gpu("H100-SXM")) == 1024
    assert v.default_max_num_seqs(get_gpu("A100-SXM-80GB")) == 256
    assert v.default_max_num_seqs(get_gpu("L4")) == 256


def test_user_file_overrides_and_bad_fields(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[engines.myengine]\ndisplay = "x"\nrepository = "me/x"\n[[engines.myengine.releases]]\n'
                 'version = "1.0"\nreleased = "2026-01-01"\ndecode_path = "compiled"\nprefill_graphs = true\n'
                 'attention = { Hopper = "fa3" }\nkv_block_tokens = 32\nmemory_budget = "free"\n'
                 'gpu_memory_utilization = 0.8\nmax_num_seqs = 64\nchunked_prefill = false\n'
                 'max_num_batched_tokens = 4096\nnon_torch_memory_gib = 1.0\nstep_overhead_s = 0.0\nweight_dtypes = { bf16 = ["Hopper"] }\n'
                 '[engines.myengine.releases.sources]\ndecode_path = "mine"\nprefill_graphs = "mine"\n'
                 'attention = "mine"\nkv_block_tokens = "mine"\nmemory_budget = "mine"\n'
                 'gpu_memory_utilization = "mine"\nmax_num_seqs = "mine"\nchunked_prefill = "mine"\n'
                 'max_num_batched_tokens = "mine"\nnon_torch_memory_gib = "mine"\nstep_overhead_s = "mine"\nweight_dtypes = "mine"\n')
    cat = load_engines(f)
    assert cat.get("myengine").gpu_memory_utilization == 0.8 and "vllm" in cat.names()
    f.write_text(f.read_text().replace('step_overhead_s = "mine"\n', ""))
    with pytest.raises(HetplanError) as e:
        load_engines(f)
    assert "step_overhead_s" in e.value.message and e.value.field.endswith(".sources")
    f.write_text(f.read_text().replace("gpu_memory_utilization = 0.8", "gpu_memory_utilization = 1.5")
                 .replace("weight_dtypes = \"mine\"\n", "weight_dtypes = \"mine\"\nstep_overhead_s = \"m\"\n"))
    with pytest.raises(HetplanError) as e:
        load_engines(f)
    assert "gpu_memory_utilization" in str(e.value)


def test_catalog_engines_cli():
    import json

    from typer.testing import CliRunner

    from hetplan.cli.main import app

    runner = CliRunner()
    r = runner.invoke(app, ["catalog", "engines"], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "vllm@0.10" in r.output and "tensorrt-llm@0.6" in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    r = runner.invoke(app, ["catalog", "engines", "sglang@0.4", "--json"])
    data = json.loads(r.output)["engines"][0]
    assert data["label"] == "sglang@0.4" and data["cuda_graph_batch_sizes"][-1] == 160
    r = runner.invoke(app, ["catalog", "engines", "vlm"])  # hetplan.cli.main.main turns this into exit 2
    assert isinstance(r.exception, HetplanError) and r.exception.field == "ENGINE"  # the argument's metavar
