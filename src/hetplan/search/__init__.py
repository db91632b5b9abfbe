"""Plan search: exhaustive, vectorised enumeration of the homogeneous plan space (:mod:`.homogeneous`),
objectives and constraints (:mod:`.objective`), and the explanation of the ranking (:mod:`.explain`)."""
