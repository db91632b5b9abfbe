"""Worker for test_tp_equivalence (run under torchrun with 2 ranks): the DTensor TP stage gives the loss and the
gradients of the unsharded stage. Writes one JSON file per rank into the folder given as second argument."""

import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hetplan.model.spec import load_model
from hetplan.profile import torchparts

if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    m = load_model(sys.argv[1])
    full = torchparts.build_stage(m, 0, 2, False, True)
    tp = torchparts.build_stage(m, 0, 2, False, True, tp_mesh=mesh)
    x = torchparts.sample_input(m, False, 2, 16, torch.float32, "cpu")
    x2 = x.detach().clone().requires_grad_(True)
    tgt = torch.randint(0, m.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    l1 = torchparts.loss_fn(full(x), tgt)
    l1.backward()
    l2 = torchparts.loss_fn(tp(x2), tgt)
    l2.backward()
    g1, g2 = full.layers[0].norm1.weight.grad, tp.layers[0].norm1.weight.grad
    out = {"rank": dist.get_rank(), "loss_full": float(l1), "loss_tp": float(l2),
                      "input_grad_diff": float((x.grad - x2.grad).abs().max()), "input_grad_max": float(x.grad.abs().max()),
                      "norm_grad_diff": float((g1 - g2).abs().max()), "norm_grad_max": float(g1.abs().max())}
    with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as fh:
        json.dump(out, fh)
    torchparts.finish_process_group(True)
    torchparts.exit_rank(0)
