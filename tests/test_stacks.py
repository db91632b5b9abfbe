"""Software stacks as data (:mod:`hetplan.hardware.stacks`): the data file, resolution by version and month, the
job field, what the stack switches in the estimate, and the CLI (``catalog stacks``, ``--stack``)."""

import json
import subprocess
import sys

import pytest

from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate
from hetplan.hardware.stacks import FIELDS, FRAMEWORK_STACK, STACK_NAMES, default_stack, load_stacks, resolve_stack
from hetplan.jobfile import validated
from hetplan.plan import Job
from hetplan.plan_rules import PlanRuleError, check_plan


def test_every_stack_every_field_sourced_and_releases_in_order():
    cat = load_stacks()
    assert {s.name for s in cat.stacks} == set(STACK_NAMES)
    for name in STACK_NAMES:
        rel = cat.releases(name)
        assert [r.released for r in rel] == sorted(r.released for r in rel)
        for r in rel:
            missing = [f for f in FIELDS[1:] + ("released",) if not r.sources.get(f, "").strip()]
            assert not missing, (r.id, missing)
    assert len({s.id for s in cat.stacks}) == len(cat.stacks)


def test_resolve_by_name_version_and_month():
    assert resolve_stack("megatron-lm").id == load_stacks().releases("megatron-lm")[-1].id
    assert resolve_stack("NeMo@24.07").id == "nemo@24.07"
    # a month resolves to the release in force then: v3.0 (sequence parallelism) came in 2022-07
    assert resolve_stack("megatron-lm@2022-06").version == "2.5"
    assert resolve_stack("megatron-lm@2022-07").version == "3.0"
    assert resolve_stack("megatron-lm@2022-07-15").version == "3.0"
    assert not resolve_stack("megatron-lm@2022-06").sequence_parallel
    # a numbered release between two listed ones is the listed one before it, as a month is
    for text, listed in (("nemo@22.11", "nemo@22.09"), ("megatron-lm@core_r0.10", "megatron-lm@core_r0.9"),
                         ("megatron-lm@core_r0.13.1", "megatron-lm@core_r0.12"), ("nemo@22.05.01", "nemo@22.05"),
                         ("torchtitan@0.3.1", "torchtitan@0.3.0"), ("deepspeed@0.16.3", "deepspeed@0.16"),
                         ("megatron-lm@core_r0.15.2", "megatron-lm@core_r0.15"),  # a patch of the latest listed
                         ("deepspeed@0.9", "deepspeed@0.6.2"), ("deepspeed@0.6.1", "deepspeed@0.6.0"),
                         ("deepspeed@0.5.9", "deepspeed@0.5.5"), ("deepspeed@0.12", "deepspeed@0.9.2")):
        assert resolve_stack(text).id == listed
    # a YY.MM label of a stack whose YY.MM labels are months (NeMo, megatron-lm@23.04) is that month: 24.01 is
    # not "after 23.04" but January 2024, when Megatron Core 0.4 was in force
    for text, listed in (("megatron-lm@24.01", "megatron-lm@core_r0.4"), ("megatron-lm@25.04", "megatron-lm@core_r0.9"),
                         ("megatron-lm@23.10", "megatron-lm@23.04"), ("megatron-lm@22.01", "megatron-lm@2.5")):
        assert resolve_stack(text).id == listed
    # releases as their git tags spell them (DeepSpeed / torchtitan v0.x.y, Megatron-LM core_v0.x.y)
    for text, listed in (("deepspeed@v0.9.2", "deepspeed@0.9.2"), ("torchtitan@v0.3.0", "torchtitan@0.3.0"),
                         ("megatron-lm@core_v0.12.1", "megatron-lm@core_r0.12"), ("nemo@v22.06", "nemo@22.06")):
        assert resolve_stack(text).id == listed
    for bad, words in (("megatronlm", "did you mean 'megatron-lm'"), ("nemo@1.0", "no release '1.0'"),
                       ("nemo@21.12", "no release by 2021-12"), ("torchtitan@0.0.9", "no release '0.0.9'"),
                       ("nemo@22.13", "not a month"),
                       ("nemo@2020-01", "no release by 2020-01"), ("nemo@2024-13", "not a month"),
                       ("megatron-lm@", "no release after '@'"), ("torchtitan@ ", "no release after '@'"),
                       ("deepspeed@vx", "no release 'vx'"),
                       # after what the catalog knows: it cannot say what ran, and resolved silently to its latest
                       ("megatron-lm@2027-06", "after the stack catalog's date"),
                       ("nemo@27.01", "after the stack catalog's date"),
                       ("megatron-lm@core_r0.99", "newer than the catalog's latest"),
                       ("deepspeed@0.99", "newer than the catalog's latest"), ("torchtitan@0.9", "newer than"),
                       # past the end of a numbering a later one replaced: resolved silently to megatron-lm@3.0
                       ("megatron-lm@9.9", r"after 3.0 \(2022-07\) its releases are numbered like 23.04"),
                       ("megatron-lm@3.1", "numbered like 23.04")):
        with pytest.raises(HetplanError, match=words) as exc:
            resolve_stack(bad)
        assert exc.value.field == "job.stack" and exc.value.fix


def test_default_stacks_are_what_export_writes_and_keep_todays_kernels():
    assert {fw: default_stack(fw).name for fw in FRAMEWORK_STACK} == {
        "megatron": "megatron-lm", "deepspeed": "deepspeed", "fsdp": "torchtitan"}
    # the kernels the estimate ran before stacks were data: cuDNN on Hopper/Blackwell under Megatron-Core and
    # torchtitan (since 6a3a9da), FlashAttention-2 elsewhere and under DeepSpeed
    for fw, hopper in (("megatron", "cudnn"), ("fsdp", "cudnn"), ("deepspeed", "fa2")):
        st = default_stack(fw)
        assert st.kernel_on("Hopper GH100") == hopper and st.kernel_on("Ampere GA100") == "fa2"
        assert st.kernel_on("Blackwell GB100") == hopper
    assert default_stack("fsdp").launch == "compiled" and default_stack("megatron").dp_overlap == "bucketed"


def _job(**kw):
    return validated(Job, dict(model="llama2-7b", seq_len=4096, global_batch=64, **kw), "job")


def test_job_stack_sets_defaults_and_refuses_contradictions():
    j = _job(stack="llm-foundry")
    assert (j.framework, j.attention, j.torch_compile, j.stack) == ("fsdp", "flash", False, "llm-foundry@0.3")
    j = _job(stack="megatron-lm@2021-06")
    assert (j.framework, j.attention, j.stack) == ("megatron", "standard", "megatron-lm@2.5")
    assert _job(stack="torchtitan@2024-06", torch_compile=True).torch_compile  # a given field wins
    assert _job().stack_spec().id == default_stack("megatron").id
    with pytest.raises(HetplanError, match="runs framework 'megatron', not 'fsdp'"):
        _job(stack="nemo", framework="fsdp")
    with pytest.raises(HetplanError, match="no fused"):
        _job(stack="nemo@22.09", attention="flash")
    with pytest.raises(HetplanError) as exc:
        _job(stack="titan")
    assert exc.value.field == "job.stack"


def _plan(stack=None, tp=4, pp=1, dp=8, zero=0, **kw):
    m = gpt_model(24, 4096, 32, 2048)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=tp, pp=pp, dp=dp, mbs=1, gbs=8 * dp, recompute="none",
                         seq=2048, inter_node_bandwidth_bytes_per_s=25e9, sequence_parallel=True,
                         overlap_grad_reduce=True, dtype="bf16")
    job = plan.job.model_dump()
    if stack is not None:
        job = {k: v for k, v in job.items() if k not in ("framework", "attention")} | {"stack": stack}
    return m, plan.model_copy(update=dict(job=Job.model_validate(job), zero=zero, **kw))


def test_megatron_2021_has_no_sequence_parallelism_and_2022_no_overlapped_distributed_optimizer():
    m, new = _plan("megatron-lm@3.0")
    _, old = _plan("megatron-lm@2.5")
    e_new, e_old = estimate(new, model=m), estimate(old, model=m)
    # without SP each TP rank keeps the LayerNorm/dropout activations whole (Korthikanti et al. 2022, Table 2)
    assert e_old.stages[0].memory.activations > 1.2 * e_new.stages[0].memory.activations
    # ZeRO-0 through torch DDP overlaps in both (--DDP-impl torch): hidden behind backward as far as it lasts
    no_overlap = estimate(old.model_copy(update={"overlap_grad_reduce": False}), model=m).dp_exposed_time_s
    assert e_old.dp_exposed_time_s < 0.99 * no_overlap
    assert e_old.dp_exposed_time_s == pytest.approx(e_new.dp_exposed_time_s, rel=0.01)
    # v3.0's distributed optimizer reduce-scatters after backward; Megatron-Core 0.4's --overlap-grad-reduce hides
    # part of it
    m, z1 = _plan("megatron-lm@3.0", zero=1)
    _, core = _plan("megatron-lm@core_r0.4", zero=1)
    assert estimate(core, model=m).dp_exposed_time_s < 0.99 * estimate(z1, model=m).dp_exposed_time_s


def test_deepspeed_pipeline_engine_reduces_after_the_last_microbatch():
    """DeepSpeed's TrainSchedule issues ReduceGrads after the schedule: plan.overlap_grad_reduce changes nothing
    at pp > 1, while ZeRO-1 without a pipeline overlaps its buckets (overlap_comm)."""
    for pp, zero, hides in ((2, 1, False), (1, 0, False), (1, 1, True)):
        m, on = _plan("deepspeed", tp=1, pp=pp, dp=8, zero=zero)
        off = on.model_copy(update=dict(overlap_grad_reduce=False))
        t_on, t_off = estimate(on, model=m).dp_exposed_time_s, estimate(off, model=m).dp_exposed_time_s
        assert (t_on < 0.9 * t_off) if hides else (t_on == pytest.approx(t_off)), (pp, zero)


def test_plan_options_the_stack_lacks_are_refused():
    m, plan = _plan("megatron-lm@2.5", tp_comm_overlap=True)
    with pytest.raises(PlanRuleError, match="TP-communication overlap, which stack megatron-lm@2.5 lacks") as exc:
        check_plan(plan, m)
    assert exc.value.rule == "stack-has-option" and exc.value.field == "plan.tp_comm_overlap"
    m, plan = _plan("megatron-lm@core_r0.4", tp_comm_overlap=True)
    check_plan(plan, m)


def _hetplan(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_cli_catalog_stacks_and_stack_flag(tmp_path):
    r = _hetplan("catalog", "stacks", "--json")
    assert r.returncode == 0, r.stderr
    assert {s["id"] for s in json.loads(r.stdout)["stacks"]} == {s.id for s in load_stacks().stacks}
    r = _hetplan("catalog", "stacks", "nemo@2024-08")
    assert r.returncode == 0 and "nemo@24.07" in r.stdout and "PR #9188" in r.stdout
    base = ("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "64", "--gpu", "A100-SXM-80GB",
            "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "3", "--top", "1", "--json")
    r = _hetplan(*base, "--stack", "megatron-lm@2026-11", "-o", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p.json").read_text())["job"]["stack"] == "megatron-lm@core_r0.15"
    assert json.loads(r.stdout)["plans"][0]["stack"] == "megatron-lm@core_r0.15"
    for month in ("1999-01", "2099-01"):  # before its first release; after what the catalog knows
        r = _hetplan(*base, "--stack", f"megatron-lm@{month}")
        assert r.returncode == 2 and "error: --stack:" in r.stderr and "Traceback" not in r.stderr
    r = _hetplan("estimate", tmp_path / "p.json", "--json", "--stack", "llm-foundry")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())  # llm-foundry's fsdp_config runs FULL_SHARD only
    (tmp_path / "z1.json").write_text(json.dumps({**plan, "zero": 1}))
    r = _hetplan("estimate", tmp_path / "z1.json", "--stack", "llm-foundry")
    assert r.returncode == 2 and "ZeRO-1, which stack llm-foundry@0.3 lacks" in r.stderr and "stack-has-option" in r.stderr
    r = _hetplan("estimate", tmp_path / "p.json", "--stack", "fms")
    assert r.returncode == 2 and "did you mean 'fms-fsdp'" in r.stderr


def test_speed_error_sign_follows_the_quantity():
    """+ = predicted too fast, whether the row measures a time or a rate (the issue's '+26 %')."""
    from hetplan.calibration.modern import ModernCase
    from hetplan.calibration.validation import Case, speed_error

    slow_time = Case(set="vtrain_single_node", key="a", group="g", measured=1.0, predict=None, predicted=1.25)
    fast_rate = ModernCase(set="torchtitan", key="b", group="g", measured=100.0, predict=None, predicted=125.0,
                           quantity="tokens_per_s_per_gpu")
    sc21 = Case(set="megatron_sc21_table1", key="c", group="g", measured=150.0, predict=None, predicted=120.0)
    assert speed_error(slow_time) == pytest.approx(-0.2)
    assert speed_error(fast_rate) == pytest.approx(0.25)
    assert speed_error(sc21) == pytest.approx(-0.2)


def test_search_enumerates_only_what_the_stack_offers():
    """Megatron-LM 2.5 has neither the distributed optimizer (ZeRO-1) nor selective recomputation: the searches
    offer neither, and a plan that asks for them is refused; Megatron-Core offers both."""
    from hetplan.search.space import Pins, enumerate_space

    m = gpt_model(24, 2048, 16, 2048)
    old = enumerate_space(m, 64, 32, 8, Pins(), "standard", 2048, stack=resolve_stack("megatron-lm@2.5"))
    new = enumerate_space(m, 64, 32, 8, Pins(), "standard", 2048, stack=resolve_stack("megatron-lm"))
    assert set(old["zero"].tolist()) == {0} and set(old["recompute"].tolist()) == {0, 2}
    assert set(new["zero"].tolist()) == {0, 1, 2, 3} and set(new["recompute"].tolist()) == {0, 1, 2}
    assert len(old["tp"]) < len(new["tp"])
    m, plan = _plan("megatron-lm@2.5", zero=1)
    with pytest.raises(PlanRuleError, match="ZeRO-1, which stack megatron-lm@2.5 lacks"):
        check_plan(plan, m)
    m, plan = _plan("megatron-lm@2.5")
    plan = plan.model_copy(update={"stages": [st.model_copy(update={"recompute": "selective"}) for st in plan.stages]})
    with pytest.raises(PlanRuleError, match="selective recomputation"):
        check_plan(plan, m)


def test_deepspeed_zero1_keeps_fp32_master_copies_for_its_partition_only():
    """DeepSpeed ZeRO-1 (stage_1_and_2.py): 16-bit weights and .grad, fp32 master + Adam of the owned partition:
    2 + 2 + 12/dp bytes per parameter, where Megatron's distributed optimizer keeps a 4-byte fp32 main-grad."""
    dp = 8
    m, ds = _plan("deepspeed", tp=1, pp=1, dp=dp, zero=1)
    _, mg = _plan("megatron-lm", tp=1, pp=1, dp=dp, zero=1)
    ds_mem, mg_mem = estimate(ds, model=m).stages[0].memory, estimate(mg, model=m).stages[0].memory
    assert ds_mem.gradients == pytest.approx(ds_mem.weights)
    assert ds_mem.optimizer == pytest.approx(6 / dp * ds_mem.weights)
    assert mg_mem.gradients == pytest.approx(2 * mg_mem.weights)
    # ZeRO-0 DeepSpeed in fp16 keeps the layout its traces measured (FP16_Optimizer: the 4-byte term plus 16-bit
    # .grad); in bf16 v0.16 hands ZeRO-0 to BF16_Optimizer (16-bit .grad + its fp32 gradient buffer)
    _, ds0 = _plan("deepspeed", tp=1, pp=1, dp=dp, zero=0)
    fp16 = ds0.model_copy(update={"job": ds0.job.model_copy(update={"dtype": "fp16"})})
    assert estimate(fp16, model=m).stages[0].memory.gradients == pytest.approx(2 * ds_mem.weights)
    assert estimate(ds0, model=m).stages[0].memory.gradients == pytest.approx(3 * ds_mem.weights)


def test_megatron_stacks_without_the_fused_loss_run_it_on_fp32_logits():
    from hetplan.estimate.options import TrainingOptions

    _, old = _plan("megatron-lm@3.0")
    _, new = _plan("megatron-lm")
    assert TrainingOptions.from_plan(old).cross_entropy == "fp32"
    assert TrainingOptions.from_plan(new).cross_entropy is None


def test_paper_sets_run_their_papers_megatron_release():
    """SC'21 ran Megatron-LM v2.5 and Korthikanti et al. v3.0: their validation plans name those releases, so
    the unfused fp32 loss of those releases is priced (slower than today's default stack's fused loss)."""
    from hetplan.calibration.validation import DEFAULT, korthikanti_cases, megatron_plan, sc21_cases, _time_predictor

    assert {c.plan.job.stack for c in sc21_cases()} == {"megatron-lm@2.5"}
    assert {c.plan.job.stack for c in korthikanti_cases()} == {"megatron-lm@3.0"}
    c = sc21_cases()[0]
    kw = dict(gpu="A100-SXM-80GB", tp=1, pp=1, dp=32, mbs=16, gbs=512, recompute="full", seq=2048,
              inter_node_bandwidth_bytes_per_s=200e9)
    old = _time_predictor(megatron_plan(c.model, stack="megatron-lm@2.5", **kw), c.model)(DEFAULT)
    new = _time_predictor(megatron_plan(c.model, **kw), c.model)(DEFAULT)
    assert old > new


def test_export_writes_the_default_stack_and_says_when_the_plan_was_priced_for_another():
    from hetplan.model.spec import load_model
    from hetplan.runtime.exporters import export

    m = load_model("llama2-7b")
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=2, pp=1, dp=4, mbs=1, gbs=8, recompute="none", seq=2048,
                         inter_node_bandwidth_bytes_per_s=25e9, sequence_parallel=True, dtype="bf16")
    job = {k: v for k, v in plan.job.model_dump().items() if k not in ("framework", "attention")}
    assert not [n for n in export(plan, m, "megatron").notes if "priced for stack" in n]
    old = plan.model_copy(update={"job": Job.model_validate(job | {"stack": "megatron-lm@3.0"})})
    notes = [n for n in export(old, m, "megatron").notes if "priced for stack" in n]
    assert notes and "megatron-lm@3.0" in notes[0] and default_stack("megatron").id in notes[0]


def test_cli_catalog_stack_detail_fits_80_columns_and_prints_sources_as_written():
    """``catalog stacks torchtitan@0.3.0`` printed 470-column source lines, and rich read the TOML sections
    in them (``[parallelism] enable_async_tensor_parallel``) as markup and dropped them."""
    import os

    env = {**os.environ, "COLUMNS": "80"}
    for args in (("catalog", "stacks", "torchtitan@0.3.0"), ("catalog", "engines", "vllm")):
        r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", *args], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        assert max(len(line) for line in r.stdout.splitlines()) <= 80
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "catalog", "stacks", "torchtitan@0.3.0"],
                       capture_output=True, text=True, timeout=120, env=env)
    text = " ".join(r.stdout.split())
    st = resolve_stack("torchtitan@0.3.0")
    for f in ("tp_comm_overlap", "launch", "fsdp_units"):
        assert " ".join(st.sources[f].split()) in text


def test_fp8_only_where_the_stack_has_an_fp8_path():
    """Releases before an FP8 GEMM path (Megatron-LM before Transformer Engine, NeMo 22.xx, Megatron-DeepSpeed,
    DeepSpeed's engine) refuse dtype fp8 in the plan rule and before the search, each with the source of the absence;
    the releases with Transformer Engine take it."""
    no_fp8 = [s for s in load_stacks().stacks if not s.fp8]
    assert {s.name for s in no_fp8} == {"megatron-lm", "nemo", "megatron-deepspeed", "deepspeed"}
    assert all(s.sources["fp8"].strip() for s in no_fp8)
    assert resolve_stack("megatron-lm@2.5").fp8 is False and resolve_stack("megatron-lm@23.04").fp8
    assert resolve_stack("nemo@22.09").fp8 is False and resolve_stack("nemo@23.05").fp8
    m = gpt_model(4, 1024, 16, 2048)
    kw = dict(gpu="H100-SXM", tp=1, pp=1, dp=8, mbs=1, gbs=8, recompute="none", seq=2048,
              inter_node_bandwidth_bytes_per_s=50e9, dtype="fp8")
    with pytest.raises(PlanRuleError) as exc:
        check_plan(megatron_plan(m, stack="megatron-lm@2.5", **kw), m)
    assert exc.value.rule == "stack-has-option" and exc.value.field == "plan.job.dtype"
    check_plan(megatron_plan(m, stack="megatron-lm@core_r0.4", **kw), m)
    r = _hetplan("plan", "--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "16", "--seq-len", "4096",
                 "--global-batch", "64", "--dtype", "fp8", "--framework", "deepspeed", "-q")
    assert r.returncode == 2 and "error: --dtype:" in r.stderr and "stack-has-option" in r.stderr, r.stderr


def test_deepspeed_bf16_runs_only_the_zero_stages_its_release_accepts(tmp_path):
    """DeepSpeed's own checks decide which ZeRO stages a bf16 run may use: none before v0.5.5 (no bf16 section),
    ZeRO-2 in v0.5.5, ZeRO 1-3 in v0.6.0, every stage from v0.6.2; under a pipeline ZeRO-0 only from v0.6.2 to
    v0.9.1 (``_exec_reduce_grads`` raises for ZeRO-1), ZeRO 0-1 from v0.9.2. The search proposes only those,
    a pinned one is exit 2 before it, and ``check_plan`` refuses a plan that breaks them."""
    rule = {v: tuple(resolve_stack(f"deepspeed@{v}").allows_bf16(z, pp) for pp in (1, 2) for z in (0, 1, 2))
            for v in ("0.5", "0.5.5", "0.6.0", "0.6.2", "0.9.2", "0.16")}
    assert rule == {"0.5": (False,) * 6, "0.5.5": (False, False, True, False, False, True),
                    "0.6.0": (False, True, True, False, True, True),
                    "0.6.2": (True, True, True, True, False, False),
                    "0.9.2": (True, True, True, True, True, False), "0.16": (True, True, True, True, True, False)}
    args = ("plan", "--model", "llama2-7b", "--gpu", "A100-SXM-80GB", "--gpus", 32, "--seq-len", 4096,
            "--global-batch", 256, "--tokens", "1e9", "--framework", "deepspeed", "--dtype", "bf16", "--pp", 2)
    zeros = {}
    for v in ("0.6.2", "0.9.2"):
        r = _hetplan(*args, "--stack", f"deepspeed@{v}", "--json", "--top", 5)
        assert r.returncode == 0, r.stderr
        zeros[v] = {p["zero"] for p in json.loads(r.stdout)["plans"] if p["dp"] > 1}
    assert zeros["0.6.2"] == {0} and 1 in zeros["0.9.2"]
    pinned = _hetplan(*args, "--stack", "deepspeed@0.6.2", "--zero", 1)
    assert pinned.returncode == 2 and "error: --zero:" in pinned.stderr and "NotImplementedError" in pinned.stderr
    old = _hetplan(*args, "--stack", "deepspeed@2021-09")
    assert old.returncode == 2 and "error: --dtype:" in old.stderr and "stack-has-option" in old.stderr
    r = _hetplan(*args, "--stack", "deepspeed@0.9.2", "--zero", 1, "-o", tmp_path / "z1.json")
    assert r.returncode == 0, r.stderr
    from hetplan.plan import Plan

    z1 = Plan.model_validate_json((tmp_path / "z1.json").read_text())
    plan = z1.model_copy(update={"job": z1.job.model_copy(update={"stack": "deepspeed@0.6.2"})})
    from hetplan.model.spec import load_model
    from hetplan.plan_rules import violations

    m = load_model("llama2-7b")
    assert any(e.rule == "stack-has-option" and e.field == "plan.zero" for e in violations(plan, m))
    with pytest.raises(PlanRuleError, match="NotImplementedError"):
        check_plan(plan, m)
    check_plan(plan.model_copy(update={"zero": 0}), m)  # ZeRO-0 in bf16 under a pipeline: BF16_Optimizer


def test_fits_on_no_gpu_names_what_the_stack_withheld():
    """GPT-3 175B in bf16 on 64 A100-80GB: deepspeed@0.5.5 runs no TP and bf16 only at ZeRO-2, so no plan fits;
    the error names those limits beside the inventory, and the fix names the other way out (another release).
    Under deepspeed@0.6.2 (bf16 at every stage) the same job plans."""
    args = ("plan", "--model", "gpt3-175b", "--gpu", "A100-SXM-80GB", "--gpus", 64, "--seq-len", 2048,
            "--global-batch", 512, "--iterations", 10, "--dtype", "bf16")
    r = _hetplan(*args, "--stack", "deepspeed@0.5.5")
    assert r.returncode == 2 and "fits on no GPU" in r.stderr
    assert "no TP" in r.stderr and "bf16 only at ZeRO 2 (bf16_zero)" in r.stderr and "--stack" in r.stderr
    assert _hetplan(*args, "--stack", "deepspeed@0.6.2").returncode == 0
    plain = _hetplan(*args[:6], 8, *args[7:])  # Megatron-LM withholds nothing: the inventory alone is named
    assert plain.returncode == 2 and "fits on no GPU" in plain.stderr and "searched" not in plain.stderr


def test_nemo_automodel_gains_pipeline_and_expert_parallelism_at_its_first_tag():
    """AutoModel 25.07 runs FSDP2 with TP/CP only; v0.1.0 (2025-10) adds torch.distributed.pipelining stages and
    MoE expert parallelism: an EP plan is refused before it and searched after it, its EP cost named as such."""
    assert "ep" not in resolve_stack("nemo-automodel@2025-09").parallel
    new = resolve_stack("nemo-automodel@2025-11")
    assert new.version == "0.1.0" and {"pp", "ep"} <= set(new.parallel) and new.interleaved
    args = ("plan", "--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--gpus", 16, "--seq-len", 4096,
            "--global-batch", 256, "--tokens", "1e10", "--top", 2)
    old = _hetplan(*args, "--stack", "nemo-automodel@2025-09", "--ep", 8)
    assert old.returncode == 2 and "nemo-automodel@25.07" in old.stderr + old.stdout
    out = _hetplan(*args, "--stack", "nemo-automodel@2025-11")
    assert out.returncode == 0, out.stderr
    assert "TP/EP communication" in out.stdout  # the all-to-all is not called TP communication


def test_component_name_says_ep_where_the_all_to_all_is_in_it():
    from hetplan.search.explain import component_name

    assert component_name("tp_comm_s", {"ep": 1}, {"ep": 1}) == "TP communication"
    assert component_name("tp_comm_s", {"ep": 1}, {"ep": 8}) == "TP/EP communication"
    assert component_name("bubble_s", {"ep": 8}) == "pipeline bubble"


@pytest.mark.parametrize("text, release", [("torchtitan@v0.2.0", "2025-10"), ("torchtitan@0.1.0", "2025-05"),
                                           ("torchtitan@0.2", "2025-10"), ("torchtitan@0.2.2", "2025-10")])
def test_a_torchtitan_tag_resolves_to_the_release_in_force_that_month(text, release):
    """torchtitan's catalog entries are months; its tags (v0.1.0 2025-06-17 ... v0.2.2 2026-02-20) resolve as the
    month of the tagged commit."""
    assert resolve_stack(text).version == release


def test_an_untagged_torchtitan_version_names_the_tags_in_its_fix():
    with pytest.raises(HetplanError, match="no release") as exc:
        resolve_stack("torchtitan@0.0.9")
    assert "0.2.0" in exc.value.fix


@pytest.mark.parametrize("text, release", [("megatron_lm", "megatron-lm@core_r0.15"), ("Megatron-Core@0.12.0", "megatron-lm@core_r0.12"),
                                           ("mcore@v0.14", "megatron-lm@core_r0.14"), ("HF Accelerate", None),
                                           ("composer", None), ("NeMo AutoModel", None)])
def test_stacks_answer_to_the_names_users_give_them(text, release):
    """Spaces and underscores read as hyphens; Megatron-Core (its PyPI versions), Composer and the HF Trainer
    name the stacks that run them."""
    got = resolve_stack(text)
    if release is not None:
        assert got.id == release
    else:
        assert got.name in ("hf-accelerate", "llm-foundry", "nemo-automodel")
        assert got.id == load_stacks().releases(got.name)[-1].id
