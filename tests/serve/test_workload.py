import numpy as np
import pytest

from hetplan.errors import HetplanError
from hetplan.serve.workload import (ModelLoad, attach_prompts, draw_lengths, gamma_arrivals, generate, model_rates,
                                    offline_arrivals, read_lengths, read_trace, zipf_shares)


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
    ("arrival_s,model\n", "no requests"),  # a header alone simulated 0 requests: 100 % SLO attainment, exit 0
])
def test_read_trace_errors(tmp_path, text, needle):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(HetplanError) as e:
        read_trace(p, ["a"])
    assert needle in e.value.message and e.value.field.startswith("workload.trace")


@pytest.mark.parametrize("text,field", [
    ("arrival_s,model,prompt_len\n0.1,a,-5\n", "workload.trace.prompt_len"),
    ('{"arrival_s": 0.1, "model": "a", "max_new_tokens": -1}\n', "workload.trace.max_new_tokens"),
    ("arrival_s,model,prompt_len\n0.1,a,2.5\n", "workload.trace.prompt_len"),
])
def test_trace_negative_or_fractional_length_names_the_column(tmp_path, text, field):
    p = tmp_path / ("t.jsonl" if text.startswith("{") else "t.csv")
    p.write_text(text)
    with pytest.raises(HetplanError) as e:
        read_trace(p, ["a"])
    assert e.value.field == field and " line " in e.value.message and e.value.fix


def test_jsonl_trace_equals_csv_trace(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,model,prompt_len,max_new_tokens\n0.5,a,3,2\n0.1,a,7,4\n")
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0.5, "model": "a", "prompt_len": 3, "max_new_tokens": 2}\n\n'
                                      '{"arrival_s": 0.1, "model": "a", "prompt_len": 7, "max_new_tokens": 4}\n')
    a, b = (read_trace(tmp_path / n, ["a"]) for n in ("t.csv", "t.jsonl"))
    assert [vars(r) for r in a] == [vars(r) for r in b]
    assert [(r.arrival_s, r.prompt_len, r.max_new_tokens) for r in a] == [(0.1, 7, 4), (0.5, 3, 2)]


def test_draw_lengths_bounds_and_moments():
    rng = np.random.default_rng(0)
    u = draw_lengths("uniform", 20_000, rng, lo=4, hi=9)
    assert u.min() == 4 and u.max() == 9 and set(u.tolist()) == set(range(4, 10))
    assert list(draw_lengths("fixed", 3, rng, mean=17.4)) == [17, 17, 17]
    # log-normal with the stated mean and std of the length (the clip at 1..10^6 is far in the tails)
    x = draw_lengths("lognormal", 200_000, rng, mean=300, std=150, lo=1, hi=10**6)
    assert x.mean() == pytest.approx(300, rel=0.01) and x.std() == pytest.approx(150, rel=0.03)
    n = draw_lengths("normal", 200_000, rng, mean=100, std=10, lo=1, hi=120)
    assert n.mean() == pytest.approx(100, rel=0.01) and n.max() == 120 and n.min() >= 1
    with pytest.raises(HetplanError):
        draw_lengths("zipf", 1, rng, mean=1)


def test_read_lengths_and_its_errors(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("input_len,output_len\n10,3\n20,4\n")
    assert read_lengths(p) == [(10, 3), (20, 4)]
    p.write_text("prompt_len,output_len\n10,-3\n")
    with pytest.raises(HetplanError) as e:
        read_lengths(p)
    assert e.value.field == "workload.dataset.output_len" and "negative" in e.value.message
    p.write_text("prompt_len\n10\n")
    with pytest.raises(HetplanError, match="lacks columns"):
        read_lengths(p)
    q = tmp_path / "d.jsonl"
    q.write_text("[1, 2]\n")
    with pytest.raises(HetplanError, match="not an object"):
        read_lengths(q)


def test_offline_arrivals_split_exactly():
    reqs = offline_arrivals({"a": 0.5, "b": 0.3, "c": 0.2}, 11)
    assert len(reqs) == 11 and all(r.arrival_s == 0 for r in reqs)
    counts = {m: sum(r.model == m for r in reqs) for m in "abc"}
    assert counts == {"a": 6, "b": 3, "c": 2}  # 5.5, 3.3, 2.2: the largest remainder goes to a
    assert [r.id for r in reqs] == list(range(11))
