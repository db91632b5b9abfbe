"""Torch building blocks shared by the profiler and the trainer: a stage module with DTensor TP, timing of one
forward + backward, and tensor-level memory accounting. Imports torch (``torch`` extra).

Model. Stages are :class:`hetplan.model.torch_transformer.TransformerStage` (random weights seeded per full
tensor). For TP > 1 the stage is built whole and its layers are sharded with DTensor
(``torch.distributed.tensor.parallel``): Q, K, V, MLP up/gate column-parallel, attention output and MLP down
row-parallel (Megatron-LM's split, Shoeybi et al. 2019 Sec. 3); the autograd of the TP API inserts the
backward all-reduce of the column-parallel inputs, which the serving model's plain ``dist.all_reduce`` lacks. The
embedding and the output head stay replicated on the TP ranks (the estimator assumes them vocabulary-parallel:
a stated difference, small for the models the runtime is meant for).

Timing (:func:`time_forward_backward`): one micro-batch, after ``warmup`` untimed repeats, the median of
``repeats``; on CUDA with CUDA events, on CPU with the thread's CPU time (one intra-op thread, no TP) or
``time.perf_counter``.

Memory (:class:`SavedTensorMeter`): bytes of the tensors autograd saves for backward (activations), counted per
storage, excluding parameter storages, live from pack to the release of the graph; its peak is the activation
memory of a stage. Parameters, gradients and optimizer states are summed from the tensors themselves.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import weakref
from contextlib import contextmanager
from typing import NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from hetplan.model.spec import ModelSpec
from hetplan.model.torch_moe import ExpertGroup
from hetplan.model.torch_transformer import Partition, TransformerStage, check_tp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def finish_process_group(succeeded: bool) -> None:
    """Tear down the default process group; after a barrier when this rank succeeded.

    The barrier lets every rank finish its last transfers before any rank leaves; after a failure it is skipped
    (the peers may never arrive). A rank that succeeded then ends with :func:`exit_rank`.
    """
    import torch.distributed as dist

    if succeeded:
        dist.barrier()
    dist.destroy_process_group()


def exit_rank(code: int = 0) -> NoReturn:
    """End this rank's process now: flush stdout and stderr, then ``os._exit`` without finalizing the interpreter.

    Why: ``destroy_process_group`` does not stop gloo's worker threads (``ProcessGroupGloo::runLoop``). The thread
    that ran the last collective drops that work object only after it has woken the waiting main thread, and the
    work (a barrier keeps the works before it) holds tensors owned by Python objects; freeing them needs the GIL.
    When the main thread has meanwhile reached ``Py_FinalizeEx``, taking the GIL calls ``pthread_exit`` inside a
    ``noexcept`` destructor and the rank aborts with "terminate called without an active exception" (exit -6),
    after its results were written. A core of such a rank under load shows exactly that stack
    (``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> ``TensorImpl::decref_pyobject`` -> ``take_gil`` ->
    ``PyThread_exit_thread``, main thread in ``Py_FinalizeEx``); torch 2.13 has no call that joins the threads
    (pytorch/pytorch PR 179291 describes the same crash). Skipping finalization removes the window; ranks hold no
    state that finalization would save (results are written and closed before this call).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torch_dtype(name: str) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16`` etc."""
    return DTYPES[name]


def software_version() -> str:
    """The software that measured: ``torch <version>`` (+ ``cuda <version>`` on GPU)."""
    v = f"torch {torch.__version__}"
    if torch.cuda.is_available() and torch.version.cuda:
        v += f" cuda {torch.version.cuda}"
    return v


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` on GPU, ``"cpu"`` on the host."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def build_stage(spec: ModelSpec, start: int, end: int, first: bool, last: bool, *, tp_mesh=None,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int = 0,
                ep: ExpertGroup | None = None) -> nn.Module:
    """Layers ``[start, end)`` of ``spec`` (plus embedding / head), on ``device``, TP-sharded over ``tp_mesh``
    (a 1-D DeviceMesh) with DTensor when its size > 1; MoE layers keep this rank's experts of ``ep``
    (:mod:`hetplan.model.torch_moe`; not TP-sharded).

    Raises:
        HetplanError: TP does not divide heads / MLP width, EP the experts; bad layer range.
    """
    part = Partition(start, end, first, last, ep=ep or ExpertGroup())
    mod = TransformerStage(spec, part, seed=seed, dtype=dtype).to(device)
    t = tp_mesh.size() if tp_mesh is not None else 1
    if t > 1:
        check_tp(spec, t)
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for block in mod.layers:
            plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}
            if block.up is not None:
                plan |= {"up": ColwiseParallel(), "down": RowwiseParallel()}
            if block.gate is not None:
                plan["gate"] = ColwiseParallel()
            parallelize_module(block, tp_mesh, plan)
            block.heads //= t
            block.kv_heads //= t
    return mod


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits ``[b, s, V]`` against token ids ``[b, s]`` (mean over tokens)."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())


def sample_input(spec: ModelSpec, first: bool, mbs: int, seq_len: int, dtype: torch.dtype, device, seed: int = 0):
    """A synthetic micro-batch: token ids ``[mbs, seq_len]`` for a first stage, else hidden states
    ``[mbs, seq_len, h]`` that require grad."""
    g = torch.Generator().manual_seed(seed)
    if first:
        return torch.randint(0, spec.vocab_size, (mbs, seq_len), generator=g).to(device)
    x = torch.randn(mbs, seq_len, spec.hidden_size, generator=g).to(device=device, dtype=dtype)
    return x.requires_grad_(True)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_forward_backward(module: nn.Module, x: torch.Tensor, *, last: bool, target: torch.Tensor | None = None,
                          warmup: int = 2, repeats: int = 5, stat: str = "median",
                          clock: str | None = None) -> tuple[float, float]:
    """Median (or ``stat="min"``: minimum) ``(forward_s, backward_s)`` of one micro-batch through ``module``.

    Clocks: CUDA events on GPU. On CPU ``clock="thread"`` (the default when torch runs one intra-op thread and no
    TP collective is involved, i.e. the module has no DTensor parameters) measures the calling thread's CPU time
    (``time.thread_time``): with one intra-op thread this is the compute time without the time the OS gave to
    other processes, which makes CPU measurements on shared hosts repeatable. ``clock="wall"`` uses
    ``time.perf_counter`` (needed when the pass waits on other ranks, e.g. TP all-reduces).

    The minimum is the time without interference from other processes (shared CI hosts); verify uses it on
    both the profiled and the measured side.

    Backward: ``loss.backward()`` on a last stage (loss included in forward), else ``out.backward(ones)``.
    Gradients are zeroed between repeats (not timed).
    """
    dev = x.device
    cuda = dev.type == "cuda"
    if clock is None:
        clock = "thread" if torch.get_num_threads() == 1 and not _has_dtensor(module) else "wall"
    now = time.thread_time if clock == "thread" else time.perf_counter
    fw, bw = [], []
    for i in range(warmup + repeats):
        module.zero_grad(set_to_none=True)
        if x.grad is not None:
            x.grad = None
        _sync(dev)
        if cuda:
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
        t0 = now()
        out = module(x)
        if last:
            out = loss_fn(out, target)
        if cuda:
            e1.record()
        else:
            t1 = now()
        grad = None if last else torch.ones_like(out)
        out.backward(grad)
        if cuda:
            e2.record()
            torch.cuda.synchronize(dev)
            f, b = e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3
        else:
            t2 = now()
            f, b = t1 - t0, t2 - t1
        if i >= warmup:
            fw.append(f)
            bw.append(b)
        del out
    agg = min if stat == "min" else statistics.median
    return agg(fw), agg(bw)


def _has_dtensor(module: nn.Module) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())


class SavedTensorMeter:
    """Live and peak bytes of tensors saved for backward (see module doc). Use :meth:`track` around forward passes.

    Attributes:
        live_bytes, peak_bytes: current and peak bytes (one count per storage).
    """

    def __init__(self, exclude: nn.Module | list[nn.Module] | None = None):
        mods = exclude if isinstance(exclude, list) else ([exclude] if exclude is not None else [])
        self.excluded = set()
        for m in mods:
            for p in m.parameters():
                self.excluded.add(_storage_key(p))
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def _add(self, key: int, nbytes: int) -> None:
        if key not in self.refs:
            self.refs[key] = 0
            self.sizes[key] = nbytes
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.refs[key] += 1

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.live_bytes -= self.sizes.pop(key)
            del self.refs[key]

    @contextmanager
    def track(self):
        """Count tensors saved for backward inside this context until autograd frees them."""
        meter = self

        class _Holder:
            __slots__ = ("t", "__weakref__")

            def __init__(self, t):
                self.t = t

        def pack(t: torch.Tensor):
            key = _storage_key(t)
            if key in meter.excluded or t.device.type == "meta":
                return t
            h = _Holder(t)
            meter._add(key, t.untyped_storage().nbytes())
            weakref.finalize(h, meter._release, key)
            return h

        def unpack(h):
            return h.t if isinstance(h, _Holder) else h

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield self


def _storage_key(t: torch.Tensor) -> int:
    try:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            t = t.to_local()
    except ImportError:  # pragma: no cover
        pass
    return t.untyped_storage().data_ptr()


def _local(t: torch.Tensor) -> torch.Tensor:
    try:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            return t.to_local()
    except ImportError:  # pragma: no cover
        pass
    return t


def model_state_bytes(modules: list[nn.Module], optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer states (local shards of DTensors)."""
    params, seen = [], set()
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    w = sum(_local(p).numel() * _local(p).element_size() for p in params)
    g = sum(_local(p.grad).numel() * _local(p.grad).element_size() for p in params if p.grad is not None)
    o = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if torch.is_tensor(v) and v.numel() > 1:
                    o += _local(v).numel() * _local(v).element_size()
    return {"weights": w, "gradients": g, "optimizer": o}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; ``getrusage`` ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def collect() -> None:
    """Run the garbage collector (so released graphs decrement :class:`SavedTensorMeter`)."""
    gc.collect()
