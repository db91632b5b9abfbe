"""Pinned host<->device swap bandwidth on an NVIDIA GPU, against the host link's limit in the catalog.

Run on a GPU machine: ``python benchmarks/bench_serve_bandwidth.py [--gpu H100-SXM-80GB] [--mib 1024]``. Copies a
pinned host buffer to the device and back (``non_blocking`` on a dedicated stream per direction, as the engine's
swap does), alone and both directions at once, and prints GB/s and the fraction of the catalog's unidirectional
``host_link_bandwidth_bytes_per_s``. On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default=None, help="catalog name of this GPU (for the link limit)")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "note": "no NVIDIA GPU visible: nothing measured"}))
        return
    n = args.mib * 2**20
    host_in = torch.empty(n, dtype=torch.uint8).pin_memory()
    host_out = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev_a = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev_b = torch.empty(n, dtype=torch.uint8, device="cuda")
    s_in, s_out = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    def h2d():
        with torch.cuda.stream(s_in):
            dev_a.copy_(host_in, non_blocking=True)
        torch.cuda.current_stream().wait_stream(s_in)

    def d2h():
        with torch.cuda.stream(s_out):
            host_out.copy_(dev_b, non_blocking=True)
        torch.cuda.current_stream().wait_stream(s_out)

    def both():
        h2d()
        d2h()

    t_in, t_out, t_both = timed(h2d), timed(d2h), timed(both)
    out = {"cuda": True, "device": torch.cuda.get_device_name(), "bytes": n,
           "h2d_bytes_per_s": n / t_in, "d2h_bytes_per_s": n / t_out,
           "overlapped_each_direction_bytes_per_s": n / t_both}
    if args.gpu:
        from hetplan.hardware.catalog import get_gpu

        link = get_gpu(args.gpu).host_link_bandwidth_bytes_per_s
        out.update(link_bytes_per_s=link, h2d_fraction=n / t_in / link, d2h_fraction=n / t_out / link)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
