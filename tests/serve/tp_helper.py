"""Run in spawned processes by test_torch_transformer: a TP=2 forward + backward over Gloo, compared with the
full model (outputs and gradients)."""

import os


def tp_forward_backward(rank: int, world: int, model_path: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from hetplan.model.spec import load_model
    from hetplan.model.torch_transformer import Partition, TransformerStage
    from hetplan.profile import torchparts

    torch.set_num_threads(1)
    # a file store: no port to pick before rank 0 binds it
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=world)
    spec = load_model(model_path)
    st = TransformerStage(spec, Partition(0, spec.num_layers, True, True, rank, world, dist.group.WORLD), seed=11)
    toks = torch.randint(0, spec.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    logits = st(toks)
    logits.float().square().mean().backward()
    torch.save({"logits": logits.detach(), "grads": {n: p.grad for n, p in st.named_parameters()}},
               os.path.join(out_dir, f"rank{rank}.pt"))
    torchparts.finish_process_group(True)
    torchparts.exit_rank(0)  # finalizing the interpreter would race gloo's worker threads (see exit_rank)
