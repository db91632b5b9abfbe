"""The heterogeneous search's cost tables built together over many (b, d, ZeRO, F) shapes
(:func:`hetplan.search.hetero.cost_tables`, one :func:`~hetplan.estimate.stage.stage_costs` call per batch) equal,
bit for bit, the tables built one shape at a time."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.search import hetero
from hetplan.search.hetero import tables
from hetplan.search.hetero.group import Group
from hetplan.search.space import Pins, divisors
from tests.search.test_hetero import CAT, random_instance


def _assert_same(x: hetero.CostTable, y: hetero.CostTable) -> None:
    for name in ("a", "e", "o", "rc", "nmax"):
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    assert (x.layer_s, x.emb_s, x.head_s) == (y.layer_s, y.emb_s, y.head_s)


@pytest.mark.parametrize("seed", range(6))
def test_batched_cost_tables_equal_one_by_one(seed, monkeypatch):
    m, job, inv, _ = random_instance(seed)
    L = m.num_layers
    types = hetero.stage_types(m, inv, CAT, job.dtype, Pins())
    shapes = [(b, d, z, max(1, min(job.global_batch // (b * d), L))) for d in divisors(job.global_batch)
              for b in divisors(job.global_batch // d) for z in (0, 1)]
    monkeypatch.setattr(tables, "_BATCH_ELEMENTS", 4 * (L + 1) * 3 * L * 3)  # several batches of shapes
    for st in types:
        tables._TABLES.clear()
        batched = hetero.cost_tables(m, job, st, shapes, [0, 1, 2])
        for sh, tb in zip(shapes, batched):
            _assert_same(tb, tables._cost_tables(m, job, st, [sh], [0, 1, 2], 1, 1)[0])
        assert hetero.cost_table(m, job, st, *shapes[-1], [0, 1, 2]) is batched[-1]  # cached


@pytest.mark.parametrize("seed", range(6))
def test_batched_boundary_times_equal_one_by_one(seed):
    """:meth:`hetplan.search.hetero.group.Group.c_min` prices all equal-TP boundaries in one array call; each equals
    :func:`~hetplan.estimate.iteration.boundary_time_s` called alone."""
    from hetplan.estimate.iteration import boundary_time_s

    m, job, inv, _ = random_instance(seed)
    types = hetero.stage_types(m, inv, CAT, job.dtype, Pins())
    for d in divisors(job.global_batch)[:3]:
        g = Group(m, job, inv, types, 1, d, 0, [0, 1, 2], m.num_layers)
        if not g.types:
            continue
        g.c_min()
        pairs = [(a, b, intra) for a in g.types for b in g.types if a.tp == b.tp for intra in (False, True)]
        for a, b, intra in pairs:
            alone = boundary_time_s(m, job.seq_len, (a.tp, 1, d, 1), (b.tp, 1, d, 1), a.link, b.link, intra)
            assert g._p2p[(a.pool, a.tp, b.pool, b.tp, intra)] == alone
