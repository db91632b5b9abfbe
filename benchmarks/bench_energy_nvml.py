"""Measure real NVML energy around real forward/backward passes, per SM frequency (needs an NVIDIA GPU).

    python benchmarks/bench_energy_nvml.py [--hidden 8192 --layers 8 --batch 8 --repeat 20 --out profile.csv]

For a subset of the GPU's supported SM clocks it locks the clock (needs administrator rights; otherwise the
default clock is measured and said so), runs ``--repeat`` forward and backward passes of an MLP stack in bf16,
reads ``nvmlDeviceGetTotalEnergyConsumption`` and wall time around each (with ``torch.cuda.synchronize``), and
writes a one-stage profile in the ``stage,instruction,frequency,time,energy`` format that
``hetplan energy frontier`` reads. Without pynvml, torch with CUDA, or a GPU it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hetplan.energy.nvml import open_gpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="micro-batch rows x 1024 tokens")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--clocks", type=int, default=8, help="number of SM clocks to sweep")
    ap.add_argument("--out", type=Path, default=Path("nvml_stage_profile.csv"))
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: skipped (NVML measurements need an NVIDIA GPU)")
        return 0
    gpu = open_gpu(torch.cuda.current_device())
    if gpu is None:
        print("pynvml / NVIDIA driver not available: skipped (pip install nvidia-ml-py)")
        return 0
    clocks = gpu.supported_sm_clocks_mhz()
    step = max(len(clocks) // args.clocks, 1)
    sweep = clocks[::step][: args.clocks]
    print(f"GPU {gpu.name}: {len(clocks)} SM clocks {clocks[0]}..{clocks[-1]} MHz; sweeping {sweep}")
    layers = [torch.nn.Linear(args.hidden, args.hidden, bias=False) for _ in range(args.layers)]
    model = torch.nn.Sequential(*[m for lin in layers for m in (lin, torch.nn.GELU())]).cuda().to(torch.bfloat16)
    x = torch.randn(args.batch * 1024, args.hidden, device="cuda", dtype=torch.bfloat16)
    rows = ["stage,instruction,frequency,time,energy"]
    for f in sweep:
        locked = gpu.set_frequency_mhz(f)
        for _ in range(3):  # warm-up at this clock
            model(x).float().square().mean().backward()
        torch.cuda.synchronize()
        tf = ef = tb = eb = 0.0
        for _ in range(args.repeat):
            e0, t0 = gpu.energy_mj(), time.perf_counter()
            y = model(x).float().square().mean()
            torch.cuda.synchronize()
            e1, t1 = gpu.energy_mj(), time.perf_counter()
            y.backward()
            torch.cuda.synchronize()
            e2, t2 = gpu.energy_mj(), time.perf_counter()
            tf, ef, tb, eb = tf + t1 - t0, ef + (e1 - e0) / 1e3, tb + t2 - t1, eb + (e2 - e1) / 1e3
        n = args.repeat
        label = f if locked else gpu.sm_clock_mhz()
        print(f"{label:>5} MHz{'' if locked else ' (NOT locked: no permission)'}: forward {tf / n * 1e3:8.2f} ms "
              f"{ef / n:8.2f} J   backward {tb / n * 1e3:8.2f} ms {eb / n:8.2f} J   SM clock read {gpu.sm_clock_mhz()}")
        rows += [f"0,forward,{label},{tf / n!r},{ef / n!r}", f"0,backward,{label},{tb / n!r},{eb / n!r}"]
    gpu.reset()
    args.out.write_text("\n".join(rows) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
