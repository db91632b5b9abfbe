"""The one type the cost model's numbers have: :data:`Array`, a Python or numpy scalar or a numpy array of
them. Every cost function broadcasts, so the same formula prices one stage of a plan (scalars) or thousands of
configurations of a search (arrays, :class:`hetplan.degrees.Degrees`); numpy's own annotations cannot say
"whatever broadcasts", so the alias is ``Any`` by design, named for the reader."""

from __future__ import annotations

from typing import Any, TypeAlias

#: A scalar or a numpy array (broadcasting with the other arguments).
Array: TypeAlias = Any
