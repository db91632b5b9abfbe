"""The frequency plan server (Perseus' "GPU frequency controller" counterpart, SOSP'24 §5).

Training ranks register ``(job, rank, stage)``, fetch the frequency schedule of their next iteration and report
what they measured. Schedulers decide the schedules: online profiling, point solution, target-time pick from
the frontier (:mod:`.schedulers`). All state lives in SQLite (:mod:`.store`), so a restart loses nothing.
``fastapi``/``uvicorn`` are the ``serve`` extra; :mod:`.client` needs only ``httpx``.
"""
