"""``SERVE.toml`` and ``WORKLOAD.toml``: the serving and workload specs, validated with clear errors.

Both files share ``[cluster]``, ``[scheduler]`` and ``[[models]]``; ``SERVE.toml`` adds ``[api]``, ``WORKLOAD.toml``
adds ``[workload]``, ``[swap]`` and ``[capacity]``. Examples: ``examples/serve/``. Model paths ending in ``.json``
are resolved relative to the TOML file. Unknown keys are errors (typos never pass silently).

This module does not import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from hetplan.errors import HetplanError
from hetplan.inputs import UserInput, bounded, parse_toml, read_text, validation_message
from hetplan.model.spec import ModelSpec, load_model
from hetplan.serve.workload import MAX_TIME_S, MAX_TIME_WHY

if TYPE_CHECKING:
    from hetplan.hardware.engines import EngineSpec

#: Most requests a generated workload may expect (duration x rates): the simulator handles ~10,000 per CPU second
#: (measured: 10,176 requests of opt-1.3b in 1.1 s), so about 10 s at most; fuzz found 16,500 taking 30 s under load.
MAX_SIMULATED_REQUESTS = 100_000

#: Why arrival CVs are bounded (found by tests/fuzz: a CV of 5,981 simulated for over a minute).
_CV_WHY = ("a Gamma CV above 10 (shape below 0.01) puts nearly all arrivals into a few bursts, and the simulation "
           "then runs for minutes")


class _Strict(UserInput):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelEntry(_Strict):
    """One served model: ``name`` (API name), ``model`` (preset or config.json), ``hf_model`` (the Hugging Face
    repository or path a real engine loads, for ``--export``; default: ``model``), weights ``seed``,
    ``num_layers`` override (to shrink a preset for tests), and for workloads its own ``rate_per_s``, ``cv`` and
    SLOs ``slo_s`` (end-to-end), ``ttft_slo_s``, ``tpot_slo_s``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    model: str
    hf_model: str | None = Field(default=None, min_length=1)
    seed: int = Field(default=0, ge=0, lt=2**63)
    num_layers: int | None = Field(default=None, gt=0)
    rate_per_s: float | None = Field(default=None, ge=0)
    cv: float | None = bounded(10.0, _CV_WHY,
                               default=None, gt=0)
    slo_s: float | None = Field(default=None, gt=0)
    ttft_slo_s: float | None = Field(default=None, gt=0)
    tpot_slo_s: float | None = Field(default=None, gt=0)

    def spec(self) -> ModelSpec:
        """The model's shapes (with the ``num_layers`` override applied).

        Raises:
            HetplanError: unknown preset or bad config file.
        """
        try:
            spec = load_model(self.model)
        except HetplanError as exc:
            raise HetplanError(exc.message, field=f"models.{self.name}.model", fix=exc.fix) from None
        if self.num_layers is not None:
            spec = spec.model_copy(update={"num_layers": self.num_layers})
        return spec


class ClusterConfig(_Strict):
    """Workers: ``device`` (``cpu`` or ``cuda``), ``gpu`` (catalog name, for memory and the cost models),
    ``tp`` x ``pp`` workers, weights ``dtype``, weight memory per worker ``memory_bytes`` (default
    ``memory_fraction`` of the GPU's memory: vLLM's ``gpu_memory_utilization``). For the simulator and
    ``capacity``: the serving ``engine`` whose costs are priced (``vllm``, ``sglang``, ``tensorrt-llm``,
    ``hf-eager``, ``tgi``, or ``NAME@VERSION``; :mod:`hetplan.hardware.engines`; unset: the training cost model)
    and its weight ``quantization`` (``fp8``, ``int8``, ``int4``; unset: ``dtype`` weights)."""

    device: Literal["cpu", "cuda"] = "cpu"
    gpu: str | None = None
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dtype: Literal["fp32", "fp16", "bf16"] = "fp16"
    memory_bytes: int | None = Field(default=None, gt=0)
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    engine: str | None = Field(default=None, min_length=1)
    quantization: Literal["fp8", "int8", "int4"] | None = None

    def capacity_bytes(self) -> int:
        """Weight memory per worker (bytes): ``memory_bytes``, else ``memory_fraction`` of ``gpu``'s memory.

        Raises:
            HetplanError: neither ``memory_bytes`` nor ``gpu`` given, an unknown GPU, or ``memory_bytes`` above
                the GPU's memory (the simulator placed models in memory the GPU does not have, exit 0).
        """
        if self.gpu is None:
            if self.memory_bytes is None:
                raise HetplanError("no memory size for the workers", field="cluster.memory_bytes",
                                   fix="set cluster.memory_bytes or cluster.gpu")
            return self.memory_bytes
        from hetplan.hardware.catalog import load_catalog

        gpu = load_catalog().get(self.gpu, field="cluster.gpu")
        if self.memory_bytes is None:
            return int(gpu.memory_bytes * self.memory_fraction)
        if self.memory_bytes > gpu.memory_bytes:
            raise HetplanError(f"memory_bytes = {self.memory_bytes:,} is more than a {gpu.name} holds "
                               f"({gpu.memory_bytes:,} bytes)", field="cluster.memory_bytes",
                               fix="give at most the GPU's memory, or leave memory_bytes out (memory_fraction of "
                                   "the GPU's)")
        return self.memory_bytes


class SchedulerConfig(_Strict):
    """``policy`` (``lru`` | ``load_aware``), ``batching`` (``continuous`` | ``static``), largest running batch
    per model (``max_batch_size``, vLLM's ``max_num_seqs``), longest sequence (``kv_cache_len``: prompt +
    generated, vLLM's ``max_model_len``), per-model queue bound (beyond it: HTTP 429 / refused), whether swap-out
    writes weights back to host (``write_back``), models loaded at start (``preload``).

    Paged KV cache (:mod:`hetplan.serve.scheduler`): ``paged_kv`` on, each model's pool holds ``kv_cache_tokens``
    tokens in blocks of ``kv_block_tokens`` (unset: the engine's, else 16, vLLM's ``--block-size`` default on
    CUDA: vllm/engine/arg_utils.py ``--block-size`` help, vllm/config.py ``CacheConfig``); ``kv_cache_tokens``
    unset: the simulator fills the memory budget left by the weights (one model per GPU, vLLM's
    ``gpu_memory_utilization`` rule; with ``cluster.engine`` the engine's own budget,
    :func:`hetplan.estimate.inference.kv_capacity_tokens`) or reserves ``max_batch_size`` x ``kv_cache_len``
    (several models sharing GPUs). ``max_batched_tokens`` bounds the tokens of one iteration (vLLM's
    ``--max-num-batched-tokens``), ``chunked_prefill`` splits prompts to fit it (simulator only); unset: the
    engine's defaults, else no bound and no chunking."""

    policy: str = "lru"
    batching: Literal["continuous", "static"] = "continuous"
    max_batch_size: int = Field(default=8, ge=1, le=4096)
    kv_cache_len: int = Field(default=256, ge=2, le=1_048_576)
    max_queue_len: int = Field(default=256, ge=1)
    paged_kv: bool = True
    kv_block_tokens: int | None = Field(default=None, ge=1, le=4096)
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=2**40)
    max_batched_tokens: int | None = Field(default=None, ge=1, le=2**24)
    chunked_prefill: bool | None = None
    write_back: bool = True
    preload: list[str] = []
    rate_window_s: float = Field(default=10.0, gt=0)


class ApiConfig(_Strict):
    """HTTP server address (loopback by default; any other address needs a bearer token, given with
    ``hetplan serve --token`` or the ``HETPLAN_SERVE_TOKEN`` environment variable, never in this file), default
    and largest tokens per request, largest request body (bytes), and the drain time on shutdown (s)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    default_max_new_tokens: int = Field(default=1, ge=1)
    max_new_tokens_limit: int = Field(default=64, ge=1)
    shutdown_timeout_s: float = Field(default=10.0, ge=0, le=3600)
    max_request_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) accepts connections from this machine only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LengthSpec(_Strict):
    """A distribution of request lengths (tokens): ``dist`` = ``fixed`` (``mean``) | ``uniform`` (``min``..``max``)
    | ``normal`` / ``lognormal`` (``mean``, ``std``, clipped to ``min``..``max``); see
    :func:`hetplan.serve.workload.draw_lengths`."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    mean: float | None = Field(default=None, ge=1, le=1_048_576)
    std: float | None = Field(default=None, ge=0, le=1_048_576)
    min: int = Field(default=1, ge=1, le=1_048_576)
    max: int | None = Field(default=None, ge=1, le=1_048_576)

    @model_validator(mode="after")
    def _complete(self):
        need = {"fixed": ("mean",), "uniform": ("max",), "normal": ("mean", "std", "max"),
                "lognormal": ("mean", "std", "max")}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} length needs {' and '.join(missing)} (tokens)")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max = {self.max} is below min = {self.min}")
        if self.dist in ("normal", "lognormal") and self.max is not None and not self.min <= self.mean <= self.max:
            # the draws are clipped to min..max, while the capacity bounds and reports use the mean as given
            raise ValueError(f"mean = {self.mean:g} is outside min..max = {self.min}..{self.max}: the clipped draws "
                             "cannot have that mean")
        return self

    def upper(self) -> int:
        """The longest length it can draw (tokens)."""
        return int(round(self.mean)) if self.dist == "fixed" and self.mean is not None else int(self.max or 0)

    def mean_tokens(self) -> float:
        """Its mean length (tokens; the clipping of normal/lognormal ignored, the mid-point of uniform)."""
        return float(self.mean) if self.mean is not None else (self.min + (self.max or self.min)) / 2

    def draw(self, n: int, rng) -> list[int]:
        """``n`` lengths (:func:`hetplan.serve.workload.draw_lengths`)."""
        from hetplan.serve.workload import draw_lengths

        return draw_lengths(self.dist, n, rng, mean=self.mean, std=self.std, lo=self.min, hi=self.max).tolist()


class WorkloadConfig(_Strict):
    """Arrivals: ``duration_s``, ``seed``, Gamma ``cv``, total rate shared by Zipf rank (``zipf_exponent``) among
    models without their own ``rate_per_s``, or a CSV/JSONL ``trace``; or ``offline``: ``num_requests`` all at
    t = 0 (shared by the same rates' proportions). Request shape: fixed ``prompt_len`` and ``max_new_tokens``, or
    distributions ``[workload.input]`` and ``[workload.output]`` (:class:`LengthSpec`), or a ``dataset`` file of
    ``prompt_len,output_len`` rows (JSONL or CSV). Default SLOs: end-to-end latency ``slo_s``, time to first token
    ``ttft_slo_s``, time per output token ``tpot_slo_s`` (each optional)."""

    duration_s: float = bounded(MAX_TIME_S, MAX_TIME_WHY, default=60.0, gt=0)
    seed: int = Field(default=0, ge=0, lt=2**63)
    total_rate_per_s: float = Field(default=1.0, ge=0)
    cv: float = bounded(10.0, _CV_WHY,
                        default=1.0, gt=0)
    zipf_exponent: float = Field(default=1.0, ge=0)
    trace: str | None = None
    offline: bool = False
    num_requests: int | None = Field(default=None, ge=1, le=MAX_SIMULATED_REQUESTS)
    prompt_len: int = Field(default=64, ge=1)
    max_new_tokens: int = Field(default=1, ge=1)
    input: LengthSpec | None = None
    output: LengthSpec | None = None
    dataset: str | None = None

    def max_tokens(self) -> int:
        """The longest request (prompt + new tokens) the lengths can draw; 0 when a dataset decides (checked when
        it is read)."""
        if self.dataset is not None:
            return 0
        p = self.input.upper() if self.input else self.prompt_len
        return p + (self.output.upper() if self.output else self.max_new_tokens)

    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output lengths (tokens) of the distributions or fixed lengths (a dataset: its rows)."""
        if self.dataset is not None:
            from hetplan.serve.workload import read_lengths

            rows = read_lengths(self.dataset)
            return (sum(p for p, _ in rows) / len(rows), sum(o for _, o in rows) / len(rows))
        return (self.input.mean_tokens() if self.input else float(self.prompt_len),
                self.output.mean_tokens() if self.output else float(self.max_new_tokens))

    def assign_lengths(self, requests, kv_cache_len: int | None = None) -> None:
        """Set each request's ``prompt_len`` and ``max_new_tokens`` from the dataset (rows in order, wrapping
        around) or the distributions (seeded by ``seed``), in request order; a trace's own lengths are kept.

        Raises:
            HetplanError: a bad dataset, or (``kv_cache_len``) a dataset row longer than a sequence may be.
        """
        import numpy as np

        if self.trace is not None or not requests:
            return
        n = len(requests)
        if self.dataset is not None:
            from hetplan.serve.workload import read_lengths

            rows = read_lengths(self.dataset)
            if kv_cache_len is not None:
                long = max(rows, key=sum)
                if sum(long) > kv_cache_len:
                    raise HetplanError(f"a dataset row needs {sum(long):,} tokens (prompt + output), more than "
                                       f"scheduler.kv_cache_len = {kv_cache_len:,}", field="workload.dataset",
                                       fix="raise scheduler.kv_cache_len or drop the longer rows")
            pl = [rows[i % len(rows)][0] for i in range(n)]
            nl = [rows[i % len(rows)][1] for i in range(n)]
        else:
            rng = np.random.default_rng([self.seed, 2])
            pl = self.input.draw(n, rng) if self.input else [self.prompt_len] * n
            nl = self.output.draw(n, rng) if self.output else [self.max_new_tokens] * n
        for r, p, o in zip(requests, pl, nl):
            r.prompt_len, r.max_new_tokens = int(p), int(o)
    slo_s: float | None = Field(default=1.0, gt=0)
    ttft_slo_s: float | None = Field(default=None, gt=0)
    tpot_slo_s: float | None = Field(default=None, gt=0)


class SwapConfig(_Strict):
    """Swap-model calibration (see :mod:`hetplan.serve.swap_model`); defaults are the Computron A100 fit."""

    efficiency: float = Field(default=0.743, gt=0, le=1)
    overhead_s: float = Field(default=0.251, ge=0)
    gpus_per_switch: int = Field(default=1, ge=1)
    switch_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)


class CapacityConfig(_Strict):
    """Capacity search: candidate ``gpus`` (default: ``cluster.gpu``; none: refused), their ``prices`` in USD per
    GPU-hour (``{name = price}``, overriding the catalog's; ``hetplan capacity --price`` overrides these), the
    serving ``engines`` and weight ``quantizations`` to choose among (default: ``cluster.engine`` and
    ``cluster.quantization``; ``"none"`` is unquantized ``dtype`` weights), largest cluster ``max_gpus`` of each
    type, required fraction of requests within SLO for every model (``target_attainment``); ``exhaustive``
    simulates every candidate replica instead of only those a bound on their rate cannot rule out (the same
    answer, slower: :func:`hetplan.serve.capacity.plan_capacity`); ``share_gpus`` also tries replica groups that
    several models share by swapping (Computron; up to 6 models)."""

    gpus: list[str] = []
    engines: list[str] = []
    quantizations: list[Literal["none", "fp8", "int8", "int4"]] = []
    prices: dict[str, Annotated[float, bounded(1000.0, "no GPU rents for $1,000 an hour", gt=0)]] = Field(
        default_factory=dict)
    max_gpus: int = Field(default=8, ge=1)
    target_attainment: float = Field(default=0.99, gt=0, le=1)
    exhaustive: bool = False
    share_gpus: bool = True


class _Common(_Strict):
    cluster: ClusterConfig = ClusterConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    models: list[ModelEntry]

    @model_validator(mode="after")
    def _names(self):
        names = [m.name for m in self.models]
        if not names:
            raise ValueError("models lists no model; fix: add a [[models]] entry with a name and a model")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"models has duplicate names {sorted(dup)}; fix: give each [[models]] entry its own name")
        for p in self.scheduler.preload:
            if p not in names:
                raise ValueError(f"scheduler.preload names unknown model {p!r}; fix: name models of the [[models]] "
                                 f"entries: {', '.join(names)}")
        return self

    def check_split(self, engine: EngineSpec | None = None) -> None:
        """``cluster.tp`` splits every model's heads, key/value heads and MLP width
        (:func:`hetplan.estimate.inference.check_tp`; a serving ``engine`` replicates key/value heads) and
        ``cluster.pp`` gives each stage a layer at least.

        Raises:
            HetplanError: naming ``cluster.tp`` (with the degrees up to 16 that split every model) or ``cluster.pp``.
        """
        from hetplan.estimate.inference import check_tp

        specs = {m.name: m.spec() for m in self.models}

        def splits(tp: int) -> bool:
            try:
                for spec in specs.values():
                    check_tp(spec, tp, engine)
            except HetplanError:
                return False
            return True

        c = self.cluster
        for name, spec in specs.items():
            try:
                check_tp(spec, c.tp, engine)
            except HetplanError as exc:
                fits = ", ".join(str(t) for t in range(1, 17) if splits(t))
                raise HetplanError(f"{exc.message} (models.{name})", field="cluster.tp",
                                   fix=f"set cluster.tp to a degree that splits every model: {fits}") from None
            if c.pp > spec.num_layers:
                raise HetplanError(f"PP = {c.pp} exceeds the {spec.num_layers} layers of model {spec.name} "
                                   f"(models.{name})", field="cluster.pp",
                                   fix=f"set cluster.pp to at most {spec.num_layers}: a stage holds a layer at least")


class ServeConfig(_Common):
    """``SERVE.toml``: cluster, scheduler, api, models."""

    api: ApiConfig = ApiConfig()


class WorkloadFile(_Common):
    """``WORKLOAD.toml``: cluster, scheduler, swap, workload, capacity, models."""

    workload: WorkloadConfig = WorkloadConfig()
    swap: SwapConfig = SwapConfig()
    capacity: CapacityConfig = CapacityConfig()

    @model_validator(mode="after")
    def _bounded_requests(self):
        rate = self.workload.total_rate_per_s + sum(m.rate_per_s or 0.0 for m in self.models)
        expected = self.workload.duration_s * rate
        w = self.workload
        if w.trace is None and not w.offline and expected > MAX_SIMULATED_REQUESTS:
            raise ValueError(f"workload.duration_s x rates = {expected:,.0f} expected requests; at most "
                             f"{MAX_SIMULATED_REQUESTS:,} (the simulator handles ~10,000 per CPU second); fix: "
                             "shorten duration_s or lower the rates")
        if w.offline and w.trace is not None:
            raise ValueError("workload.offline and workload.trace exclude each other: a trace has its own arrivals; "
                             "fix: drop one of them")
        tokens = w.max_tokens()
        if tokens > self.scheduler.kv_cache_len:  # fuzz: max_new_tokens 802,001 simulated for minutes
            raise ValueError(f"scheduler.kv_cache_len = {self.scheduler.kv_cache_len:,} tokens is shorter than the "
                             f"longest request (prompt + max_new_tokens, or the distributions' max) = {tokens:,} "
                             "tokens; fix: raise kv_cache_len or shorten the requests")
        return self


def _resolve(data: dict, base: Path) -> dict:
    for m in data.get("models", []) or []:
        if isinstance(m, dict) and isinstance(m.get("model"), str) and m["model"].endswith(".json"):
            p = Path(m["model"])
            if not p.is_absolute() and (base / p).is_file():
                m["model"] = str(base / p)
    wl = data.get("workload")
    for key in ("trace", "dataset"):
        if isinstance(wl, dict) and isinstance(wl.get(key), str):
            p = Path(wl[key])
            if not p.is_absolute() and (base / p).is_file():
                wl[key] = str(base / p)
    return data


def _load(path: str | Path, cls):
    p = Path(path)
    data = parse_toml(read_text(p, str(path)), str(path))
    data = _resolve(data, p.parent)
    return parse(data, cls, origin=str(path))


def parse(data: dict, cls, origin: str = "config"):
    """Validate a parsed TOML dictionary as ``cls``.

    Raises:
        HetplanError: the first invalid field, named by its TOML path (e.g. ``models.0.rate_per_s``).
    """
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = validation_message(exc, "", cls)  # the shared wording: value given, expected, the bound's reason
        raise HetplanError(f"{err.message} (in {origin})", field=err.field or "(top level)",
                           fix=f"{err.fix}; see examples/serve/ for the accepted keys and values") from None


def load_serve_config(path: str | Path) -> ServeConfig:
    """Read and validate ``SERVE.toml``.

    Raises:
        HetplanError: missing file, TOML syntax error (with line and column), an invalid field, a ``cluster.tp``
            or ``cluster.pp`` that does not split a model (:meth:`check_split`), or a default request length no
            request may have (``api.default_max_new_tokens`` above ``api.max_new_tokens_limit`` or without room
            for a one-token prompt in a KV-cache slot: every request without its own ``max_new_tokens`` was
            refused, 422, by a server that started).
    """
    cfg = _load(path, ServeConfig)
    cfg.check_split()
    a, slot = cfg.api, cfg.scheduler.kv_cache_len
    if a.default_max_new_tokens > a.max_new_tokens_limit:
        raise HetplanError(f"api.default_max_new_tokens = {a.default_max_new_tokens} is above api.max_new_tokens_limit "
                           f"= {a.max_new_tokens_limit} (in {path})", field="api.default_max_new_tokens",
                           fix="give a default at most the limit")
    if a.default_max_new_tokens + 1 > slot:
        raise HetplanError(f"api.default_max_new_tokens = {a.default_max_new_tokens} leaves no room for a prompt in a "
                           f"KV-cache slot of scheduler.kv_cache_len = {slot} tokens (in {path})",
                           field="api.default_max_new_tokens", fix="give a default below kv_cache_len, or raise it")
    return cfg


def load_workload_config(path: str | Path) -> WorkloadFile:
    """Read and validate ``WORKLOAD.toml``.

    Raises:
        HetplanError: missing file, TOML syntax error (with line and column), or an invalid field.
    """
    return _load(path, WorkloadFile)
