"""Multi-token prediction (``Job.mtp_layers``, Megatron-Core ``--mtp-num-layers``): what the last stage adds per
module, which stacks train it, the launch flag both ways, the refusal of ``hetplan run``, a log's argument, and the
DGX Cloud DeepSeek-V3 recipe's layer split around it."""

import pytest

from hetplan.estimate import compute
from hetplan.estimate.estimator import estimate
from hetplan.estimate.variability import slowest_gpu_factor
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage


def _plan(mtp: int = 0, split=(16, 16), tp: int = 2, dp: int = 4) -> Plan:
    job = Job(model="llama3-8b", seq_len=4096, global_batch=64, mtp_layers=mtp)
    return Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=tp * dp * len(split))],
                stages=[Stage(num_layers=n, tp=tp, dp=dp) for n in split], mbs=1, zero=1, sequence_parallel=True)


def test_each_module_adds_a_layer_the_embedding_projection_and_head_on_the_last_stage():
    """Worked example, Llama 3 8B over two stages: the MTP module costs the last stage one more layer (the same
    layer as a 15 + 17 split's extra one), the lookup of the shifted tokens in its embedding copy, the projection
    of [hnorm(h); enorm(e)] (2h -> h over TP, backward twice) and one more pass of the output head and loss; the
    first stage does not change; the last stage holds one more layer and the (untied) embedding."""
    m, h100 = load_model("llama3-8b"), load_catalog().get("H100-SXM")
    base, mtp, shifted = estimate(_plan()), estimate(_plan(1)), estimate(_plan(0, (15, 17)))
    b, s, t = 1, 4096, 2
    proj = compute.gemm_time_s(h100, "bf16", b * s, m.hidden_size / t, 2 * m.hidden_size)
    hf, hb = compute.head_time_s(m, h100, "bf16", b, s, t)
    ef, eb = compute.embedding_time_s(m, h100, b, s, t)
    slow = float(slowest_gpu_factor(t * 4, h100.speed_variability))
    layer_f = shifted.stages[1].forward_s - base.stages[1].forward_s
    layer_b = shifted.stages[1].backward_s - base.stages[1].backward_s
    assert mtp.stages[1].forward_s - base.stages[1].forward_s == pytest.approx(
        layer_f + slow * float(ef + proj + hf), rel=1e-9)
    assert mtp.stages[1].backward_s - base.stages[1].backward_s == pytest.approx(
        layer_b + slow * float(eb + 2 * proj + hb), rel=1e-9)
    assert mtp.stages[0].forward_s == base.stages[0].forward_s
    assert mtp.stages[0].memory.total == base.stages[0].memory.total
    extra = mtp.stages[1].memory.weights - base.stages[1].memory.weights
    one_layer = shifted.stages[1].memory.weights - base.stages[1].memory.weights
    embedding = m.vocab_size * m.hidden_size / t * 2  # bf16 weights of the embedding copy
    assert extra == pytest.approx(one_layer + embedding, rel=1e-6)
    assert mtp.iteration_time_s > base.iteration_time_s
    assert estimate(_plan(2)).stages[1].forward_s > mtp.stages[1].forward_s  # two modules, two of each


def test_only_megatron_core_releases_since_core_v0_12_train_it():
    """framework fsdp / deepspeed and Megatron-LM before 2025-03 are refused, naming the field and the fix."""
    for kw, words in ((dict(framework="fsdp"), "torchtitan"), (dict(stack="megatron-lm@2021-06"), "core_v0.12.0"),
                      (dict(stack="megatron-deepspeed"), "DeepSpeed")):
        with pytest.raises(ValueError, match="mtp_layers") as err:
            Job(model="deepseek-v3", seq_len=4096, global_batch=64, mtp_layers=1, **kw)
        assert words in str(err.value)
    assert Job(model="deepseek-v3", seq_len=4096, global_batch=64, mtp_layers=1, stack="nemo").mtp_layers == 1
    with pytest.raises(ValueError):
        Job(model="deepseek-v3", seq_len=4096, global_batch=64, mtp_layers=9)


def test_export_writes_the_flag_import_reads_it_and_run_refuses():
    from hetplan.calibration.logs import megatron_row
    from hetplan.errors import HetplanError
    from hetplan.runtime import planio
    from hetplan.runtime.exporters import export_megatron
    from hetplan.runtime.importers import import_megatron

    m = load_model("llama3-8b")
    files = export_megatron(_plan(1), m).files
    launch = next(name for name in files if name.endswith(".sh"))
    assert "--mtp-num-layers 1" in files[launch]
    assert "--mtp-num-layers" not in "\n".join(export_megatron(_plan(), m).files.values())
    assert import_megatron(files[launch], model="llama3-8b", gpu="H100-SXM").job.mtp_layers == 1
    with pytest.raises(HetplanError, match="mtp-num-layers"):
        import_megatron(files[launch].replace("--mtp-num-layers 1", "--mtp-num-layers 12"), model="llama3-8b")
    with pytest.raises(HetplanError, match="multi-token") as err:
        planio.layout(_plan(1), m)
    assert err.value.field == "plan.job.mtp_layers"
    log = ("------------------------ arguments ------------------------\n"
           "  mtp_num_layers .................................. 1\n"
           "  tensor_model_parallel_size ...................... 2\n"
           "-------------------- end of arguments ---------------------\n"
           + "".join(f" [2026-01-01] iteration {i:8d}/     100 | elapsed time per iteration (ms): 1000.0 |\n"
                     for i in (5, 10, 15, 20)))  # past the warm-up lines calibrate skips
    assert megatron_row(log, "log").get("mtp_layers") == "1"


def test_estimate_says_the_last_stage_trains_the_modules(tmp_path):
    from typer.testing import CliRunner

    from hetplan.cli.main import app

    path = tmp_path / "plan.json"
    path.write_text(_plan(1).model_dump_json())
    out = CliRunner().invoke(app, ["estimate", str(path)])
    assert out.exit_code == 0, out.output
    assert "multi-token prediction: 1 module(s) on the last stage" in out.output


def test_deepseek_v3_recipe_splits_its_layers_around_the_module():
    """NeMo's DeepSeek-V3 recipe counts 64 layers over the stages (the embedding one, the MTP module and the loss
    two): PP 16 gives 3, 4 x 14, 2; PP 4 gives 15, 16, 16, 14; a PP that does not divide 64 is not expressible."""
    from hetplan.calibration.modern.dgxc import mtp_stage_layers
    from hetplan.calibration.modern.rows import NotExpressibleError

    assert mtp_stage_layers(61, 16, 64) == [3] + [4] * 14 + [2]
    assert mtp_stage_layers(61, 4, 64) == [15, 16, 16, 14]
    with pytest.raises(NotExpressibleError):
        mtp_stage_layers(61, 6, 64)
