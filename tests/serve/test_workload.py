import numpy as np
import pytest

from hetplan.errors import HetplanError
from hetplan.serve.workload import (ModelLoad, attach_prompts, gamma_arrivals, generate, model_rates, read_trace,
                                    zipf_shares)


@pytest.mark.parametrize("rate,cv", [(50.0, 1.0), (20.0, 3.0), (100.0, 0.5)])
def test_gamma_arrivals_rate_and_cv(rate, cv):
    t = gamma_arrivals(rate, cv, 2000.0, np.random.default_rng(1))
    gaps = np.diff(t)
    assert len(t) / 2000.0 == pytest.approx(rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)
    assert t.min() >= 0 and t.max() < 2000.0 and np.all(gaps >= 0)


def test_gamma_reproducible_and_seed_dependent():
    a = gamma_arrivals(5, 2, 100, np.random.default_rng(7))
    b = gamma_arrivals(5, 2, 100, np.random.default_rng(7))
    c = gamma_arrivals(5, 2, 100, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a[:10], c[:10])
    assert gamma_arrivals(0, 1, 10, np.random.default_rng(0)).size == 0


def test_zipf_shares_exact():
    assert zipf_shares(3, 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    assert zipf_shares(4, 0.0) == pytest.approx([0.25] * 4)


def test_model_rates_explicit_and_zipf():
    r = model_rates(["a", "b", "c"], 9.0, 1.0, {"b": 2.0})
    assert r == pytest.approx({"a": 6.0, "b": 2.0, "c": 3.0})
    assert list(r) == ["a", "b", "c"]


@pytest.mark.parametrize("call,field", [
    (lambda: gamma_arrivals(-1, 1, 10, np.random.default_rng(0)), "rate_per_s"),
    (lambda: gamma_arrivals(1, 0, 10, np.random.default_rng(0)), "cv"),
    (lambda: model_rates(["a"], -2.0, 1.0), "workload.total_rate_per_s"),
    (lambda: model_rates(["a"], 1.0, 1.0, {"a": -1.0}), "models.a.rate_per_s"),
    (lambda: zipf_shares(3, -1), "workload.zipf_exponent"),
])
def test_bad_values_name_the_field(call, field):
    with pytest.raises(HetplanError) as e:
        call()
    assert e.value.field == field and e.value.fix


def test_generate_sorted_ids_and_independent_streams():
    loads = [ModelLoad("a", 3.0, 1.0), ModelLoad("b", 1.0, 2.0)]
    reqs = generate(loads, 50.0, seed=4, prompt_len=5, max_new_tokens=2)
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(reqs, reqs[1:]))
    assert {r.prompt_len for r in reqs} == {5}
    # adding a model leaves the arrivals of the first ones unchanged (one seed stream per model)
    more = generate(loads + [ModelLoad("c", 2.0)], 50.0, seed=4)
    for m in ("a", "b"):
        assert [r.arrival_s for r in reqs if r.model == m] == [r.arrival_s for r in more if r.model == m]
    attach_prompts(reqs, {"a": 10, "b": 20}, seed=1)
    assert all(len(r.prompt) == 5 and max(r.prompt) < (10 if r.model == "a" else 20) for r in reqs)


def test_read_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,model,prompt_len\n0.5,b,3\n0.1,a,\n")
    reqs = read_trace(p, ["a", "b"], prompt_len=7)
    assert [(r.id, r.model, r.arrival_s, r.prompt_len) for r in reqs] == [(0, "a", 0.1, 7), (1, "b", 0.5, 3)]


@pytest.mark.parametrize("text,needle", [
    ("arrival_s,model\n0.1,a\nx,a\n", "line 3"),
    ("arrival_s,model\n0.1,zz\n", "unknown model"),
    ("arrival_s,model\n-1,a\n", "line 2"),
    ("time,model\n0.1,a\n", "lacks columns"),
])
def test_read_trace_errors(tmp_path, text, needle):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(HetplanError) as e:
        read_trace(p, ["a"])
    assert needle in e.value.message and e.value.field == "workload.trace"
