"""Automatic phases: ``rec.instrument(model, optimizer, loader)`` records a training
loop without the user naming anything.

One call hooks the objects a PyTorch loop already has and writes, per optimizer
step, one ``iter`` record with these phases (docs/RUNTIME.md "Instrument your
training loop"):

==================  =====================================================  ===========
phase               what is timed                                          category
==================  =====================================================  ===========
``data_fetch``      ``next()`` on the loader's iterator (its wait for      starvation
                    a batch: the DataLoader's workers, or its own work)
``h2d_copy``        ``Tensor.to(...)``/``.cuda()`` of a CPU tensor to a    compute
                    device (a child of the phase it happens in)
``forward``         the root module's ``forward`` (an instance wrapper;    compute
                    forward hooks where the module has hooks already)
``backward``        the whole ``Tensor.backward()`` /                      compute
                    ``torch.autograd.backward()`` call
``grad_clip``       ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_      compute
                    value_`` (however it was imported)
``optimizer_step``  ``optimizer.step()`` (its step pre- and post-hooks)    compute
``zero_grad``       ``optimizer.zero_grad()`` / ``model.zero_grad()``      compute
==================  =====================================================  ===========

plus ``backward/ddp_allreduce_wait`` (sync) for a DDP model (:func:`dflash_runtime.
collectives.watch_ddp`), the point-to-point waits ``recv_wait``/``send_wait`` (sync;
:mod:`dflash_runtime.p2p`: pipeline parallelism) and, with ``syncs=True``, the implicit syncs
(:mod:`dflash_runtime.syncs`) as ``sync`` children where they happen.

Iterations. An iteration ends when the optimizer's ``step()`` returns; the next one
begins there (so the time between steps - logging, a scheduler step - stays inside
an iteration, as unaccounted time); the first begins at the first hooked call.
With gradient accumulation the micro-batches of one optimizer step are one
iteration, their phases summed (a name used twice sums). ``samples`` is counted
from the batches fetched (the first dimension of the first tensor in each batch)
unless ``samples=`` is given. The open iteration when :meth:`Instrumentation.remove`
runs is dropped (its end is unknown). With your own ``with rec.iteration()`` loop,
pass ``iterations=False``: the automatic phases then go into your iterations.

Device times: with a CUDA model (``stream="auto"``, the default: the current stream
of the model's device) or an explicit ``stream=``, ``forward``, ``backward``,
``grad_clip`` and ``optimizer_step`` also record a CUDA event pair (the record's
``gpu``, resolved by the writer thread, never by synchronising), so the analysis
can tell a sync's wait for the device's own queued work from a real stall.

Hand-named phases beside it: ``with inst.phase("loss_item"):`` (or
``rec.begun_iteration.phase(...)``) in the automatic iteration. An automatic phase
that starts while a hand-named phase is open is not recorded: your name covers that
time (implicit syncs and host-to-device copies still appear as its children).

Only calls on the thread that called ``instrument`` are recorded. Works with a
``torch.compile``\\ d model: hook the module you call (the ``OptimizedModule``), so
the hooks run outside the compiled graph.

:meth:`Instrumentation.remove` restores everything: module hooks removed (the
hook dicts as before), optimizer hooks removed, the loader class's ``__iter__``,
``Tensor.backward``, ``torch.autograd.backward``, the instance ``zero_grad``
attributes, the clip function's inner reference and the patched tensor methods put
back as the very objects that were there. One exception: a DDP communication hook
cannot be unregistered (DDP has no such call); it keeps measuring into the recorder.

Cost: per recorded phase one ``it.begin`` and one ``it.end`` (a few list appends and
a scan of the raw-log entries since the previous call) plus the hook or wrapper call;
measured per iteration by ``python -m benchmarks.bench_auto`` (aim: 20 us an
iteration, 1% of a 2 ms step; figures in docs/RUNTIME.md). Wrappers rather than
hooks where torch would otherwise take a slower path for every call (a module's
forward), and ``Tensor.to`` is left alone on a machine without a device (no copy
can go to one). torch is imported only when :func:`instrument` is called.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Self

from . import syncs as _syncs

#: Phase names of the automatic mode (module docstring).
FETCH, H2D, FORWARD, BACKWARD = "data_fetch", "h2d_copy", "forward", "backward"
CLIP, STEP, ZERO = "grad_clip", "optimizer_step", "zero_grad"
#: FSDP2's own communication (``fully_shard``): the parameters' all-gather before a
#: module's forward (and again before its backward), the gradients' reduce-scatter
#: after it. Sync phases: collectives by name (dflash_runtime.format.is_collective).
FSDP_ALLGATHER, FSDP_REDUCE_SCATTER = "fsdp_allgather", "fsdp_reduce_scatter"
#: FSDP2's methods timed, per class (torch/distributed/fsdp/_fully_shard): the
#: parameter group's ``pre_forward``/``pre_backward`` (unshard: all-gather, wait,
#: copy-out), its ``post_backward`` (reduce-scatter) and the root state's final
#: backward callback (waits for the last reduce-scatters).
FSDP_METHODS: tuple[tuple[str, str, str], ...] = (
    ("_fsdp_param_group", "FSDPParamGroup", "pre_forward"),
    ("_fsdp_param_group", "FSDPParamGroup", "pre_backward"),
    ("_fsdp_param_group", "FSDPParamGroup", "post_backward"),
    ("_fsdp_state", "FSDPState", "_root_post_backward_final_callback"),
)
#: The phases that queue device work: timed on the device too with ``stream=``.
DEVICE_PHASES = frozenset({FORWARD, BACKWARD, CLIP, STEP})

_H2D_ENTRY = (H2D, None, None)  # raw-log entry of a host-to-device copy (recorder.ENTER_X)
_ENTER, _ENTER_X = 1, 2  # recorder.ENTER, recorder.ENTER_X
_get_ident = threading.get_ident

_pc = time.perf_counter
_active_lock = threading.Lock()
_active: Instrumentation | None = None


class Instrumentation:
    """What :func:`instrument` returns: the hooks in place; :meth:`remove` undoes them.

    Attributes:
        rec: the recorder.
        steps: optimizer steps seen (iterations ended) so far.
        micro_batches: batches fetched in the open iteration.
        syncs: the :class:`~dflash_runtime.syncs.SyncCatcher` when ``syncs=True``.
    """

    def __init__(self, rec: Any, *, own_iterations: bool, samples: int | None,
                 stream: Any = None) -> None:
        self.rec = rec
        self.stream = stream  # CUDA stream of the device phases' events, or None
        self.steps = 0
        self.micro_batches = 0
        self.syncs: Any = None
        self.p2p: Any = None
        self._fsdp_open = False  # an FSDP hook is being timed (they nest: no double count)
        self._own = own_iterations
        self._samples = samples
        self._count_samples = samples is None
        self._tid = threading.get_ident()
        self._it: Any = None          # the iteration this instrumentation began
        self._auto: list[str] = []    # automatic phases open, outermost first
        self._handles: list[Any] = []  # RemovableHandles of module/optimizer hooks
        self._undo: list[Any] = []    # callables restoring patched attributes, in order
        self._fwd_depth = 0
        self._bwd_depth = 0
        self._removed = False

    # -- iterations -----------------------------------------------------------------------
    def _iteration(self):
        """The iteration to record into now, beginning one if this instrumentation owns them."""
        it = self._it
        if it is not None and it._active:
            return it
        rec = self.rec
        if not rec.enabled:
            return None
        if not self._own:
            d = rec._tls.__dict__
            for key in ("begun", "it"):
                it = d.get(key)
                if it is not None and it._active:
                    return it
            return None
        it = self._it = rec.begin_iteration(samples=self._samples)
        self.micro_batches = 0
        return it

    def _end_iteration(self) -> None:
        it = self._it
        if it is None or not it._active:
            return
        if self._count_samples and it.samples == 0:
            it.samples = None
        self._auto.clear()
        self.rec.end_iteration()
        self.steps += 1
        self._it = None
        self._iteration()  # the next one begins here (module docstring)

    @property
    def iteration(self):
        """The automatic iteration open now (begun if none is), for hand-named phases."""
        it = self._iteration()
        if it is None:
            from .recorder import NULL_ITERATION

            return NULL_ITERATION
        return it

    def phase(self, name: str, kind: str | None = None, stream: Any = None):
        """``with inst.phase(name):`` a hand-named phase in the automatic iteration."""
        return self.iteration.phase(name, stream=stream, kind=kind)

    # -- automatic phases -------------------------------------------------------------------
    def _begin(self, name: str):
        """Begin automatic phase ``name``; the iteration, or None when not recorded."""
        if _get_ident() != self._tid:
            return None
        it = self._it
        if it is None or not it._active:
            it = self._iteration()
            if it is None:
                return None
        log = it._log
        if it._scan_i == len(log) and it._scan_n == it._n and it._scan_log is log:
            opened = it._open  # nothing logged since the last scan (the common case)
        else:
            opened = it._open_blocks()  # up to date: the scan reached the log's end
        auto = self._auto
        if len(opened) != len(auto) or (auto and opened[-1] != auto[-1]):
            return None  # a hand-named phase is open: its name covers this time
        if self.stream is not None and name in DEVICE_PHASES:
            it.begin(name, stream=self.stream)  # + a CUDA event pair; end() records its end
            auto.append(name)
            return it
        app = it._app  # it.begin(name), inlined: the raw-log entries of a block start
        app(_ENTER)
        app(name)
        app(_pc())
        auto.append(name)
        opened.append(name)  # keep the scan in step with the 3 entries appended
        it._scan_i += 3
        return it

    def _wait_iteration(self):
        """The iteration a point-to-point wait goes into (:mod:`dflash_runtime.p2p`):
        on the instrumented thread, the automatic one (begun here if none is open: a
        pipeline stage's step may begin with a ``recv``); None elsewhere."""
        if _get_ident() != self._tid or self._removed:
            return None
        return self._iteration()

    def _end(self, it: Any, name: str) -> None:
        if it is None or not it._active:
            return
        auto = self._auto
        if not auto or auto[-1] != name:
            return
        auto.pop()
        opened = it._open
        log = it._log
        if (it._scan_i == len(log) and it._scan_log is log and it._scan_n == it._n
                and opened and opened[-1] == name and not it._ev_open):
            # nothing was logged since the scan and no CUDA event waits for its end:
            # end the block without rescanning
            it._app(_pc())
            opened.pop()
            it._scan_i += 1
        else:
            it.end(name)

    def _h2d(self, t0: float, t1: float) -> None:
        if threading.get_ident() != self._tid:
            return
        it = self._iteration()
        if it is not None:
            app = it._app
            app(_ENTER_X)
            app(_H2D_ENTRY)
            app(t0)
            app(t1)

    def _count(self, it: Any, batch: Any) -> None:
        self.micro_batches += 1
        if self._count_samples and it._active:
            first = batch[0] if type(batch) in (tuple, list) and batch else batch
            shape = getattr(first, "shape", None)
            try:
                n = int(shape[0]) if shape is not None and len(shape) else _batch_size(batch)
            except Exception:  # noqa: BLE001 - an odd batch object must not stop training
                n = None
            if n is not None:
                it.samples = (it.samples or 0) + n

    def wrap_loader(self, iterable: Any) -> Any:
        """``for batch in inst.wrap_loader(gen):`` times fetches (``data_fetch``) from any
        iterable (a generator, a list) whose class ``instrument`` cannot patch."""
        return _TimedLoader(iterable, self)

    # -- removal ------------------------------------------------------------------------------
    def remove(self) -> None:
        """Undo every hook and patch (module docstring); drop the open automatic iteration.

        Idempotent; never raises into training for a hook already gone."""
        global _active
        if self._removed:
            return
        self._removed = True
        it = self._it
        if it is not None and it._active:  # begun at the last step, never ended: dropped
            it._active = False
            it._kinds = it._gpu = None
            if self.rec._tls.__dict__.get("begun") is it:
                self.rec._tls.begun = None
        self._it = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        _syncs.set_h2d(None)
        if self.syncs is not None:
            self.syncs.remove()
        if self.p2p is not None:
            self.p2p.remove()
        with _active_lock:
            if _active is self:
                _active = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et, ev, tb) -> None:
        self.remove()


class _NullInstrumentation:
    """What a disabled recorder's ``instrument`` returns: nothing hooked."""

    rec = None
    steps = micro_batches = 0
    syncs = None

    @property
    def iteration(self):
        from .recorder import NULL_ITERATION

        return NULL_ITERATION

    def phase(self, name: str, kind: str | None = None, stream: Any = None):
        return self.iteration.phase(name, stream=stream, kind=kind)

    def remove(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et, ev, tb) -> None:
        pass


def _batch_size(batch: Any, depth: int = 0) -> int | None:
    """First dimension of the first tensor-like in ``batch`` (a tensor, or a list,
    tuple or dict of them, two levels deep), or None."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if depth >= 2:
        return None
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
        return None if batch is None else _batch_size(batch, depth + 1)
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0], depth + 1)
    return None


class _TimedIter:
    """The loader's iterator with ``__next__`` timed as ``data_fetch``."""

    __slots__ = ("_inner", "_inst", "_next")

    def __init__(self, inner: Any, inst: Instrumentation) -> None:
        self._inner = inner
        self._next = inner.__next__
        self._inst = inst

    def __iter__(self) -> _TimedIter:
        return self

    def __next__(self):
        inst = self._inst
        it = inst._begin(FETCH)
        try:
            batch = self._next()
        finally:
            inst._end(it, FETCH)
        if it is not None:
            inst._count(it, batch)
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TimedLoader:
    """An iterable whose iterators are timed (:meth:`Instrumentation.wrap_loader`)."""

    def __init__(self, iterable: Any, inst: Instrumentation) -> None:
        self._iterable = iterable
        self._inst = inst

    def __iter__(self) -> _TimedIter:
        return _TimedIter(iter(self._iterable), self._inst)

    def __len__(self) -> int:
        return len(self._iterable)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


def _restore_attr(owner: Any, name: str):
    """A callable putting ``owner.name`` back as it is now (own attribute or inherited)."""
    own = name in vars(owner)
    orig = vars(owner)[name] if own else None

    def undo() -> None:
        if own:
            setattr(owner, name, orig)
        else:
            try:
                delattr(owner, name)
            except AttributeError:
                pass
    return undo


def _unwrap_optimizer(opt: Any) -> Any:
    """The torch optimizer inside a framework wrapper (Accelerate, Lightning)."""
    for _ in range(3):
        # Accelerate's AcceleratedOptimizer subclasses Optimizer without its __init__:
        # it has the register method but not the hook dicts; its .optimizer has them.
        if hasattr(opt, "register_step_post_hook") and hasattr(opt, "_optimizer_step_post_hooks"):
            return opt
        inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
        if inner is None:
            break
        opt = inner
    msg = f"instrument: optimizer must be a torch.optim.Optimizer, got {type(opt).__name__}"
    raise TypeError(msg)


def instrument(rec: Any, model: Any = None, optimizer: Any = None, loader: Any = None, *,
               syncs: bool = False, iterations: bool = True, samples: int | None = None,
               ddp: bool = True, p2p: bool = True, fsdp: bool = True,
               stream: Any = "auto") -> Instrumentation | _NullInstrumentation:
    """Hook ``model``, ``optimizer`` and ``loader`` so that ``rec`` records their phases.

    Args:
        rec: the :class:`~dflash_runtime.Recorder`.
        model: the module the loop calls (a ``torch.compile``\\ d one: the compiled
            module); its calls are ``forward``. A DDP module also gets
            :func:`~dflash_runtime.collectives.watch_ddp` (``ddp=False``: not).
        optimizer: a ``torch.optim.Optimizer`` (or an Accelerate/Lightning wrapper of
            one), or a list of them: the step of the last one ends the iteration.
        loader: the iterable the loop draws batches from (a ``DataLoader``): its
            class's ``__iter__`` is patched for this object only. For a generator or
            a list use ``for batch in inst.wrap_loader(it)``.
        syncs: also catch implicit syncs (:func:`dflash_runtime.syncs.catch_syncs`).
        iterations: ``True``: iterations end at optimizer steps (module docstring);
            ``False``: the phases go into the iterations you open yourself.
        samples: samples per iteration; None counts them from the fetched batches.
        ddp: watch a DDP model's all-reduce wait.
        p2p: time point-to-point waits (``send``/``recv``, the ``wait()`` of
            ``isend``/``irecv``/``batch_isend_irecv``: pipeline parallelism) as the
            ``sync`` phases ``recv_wait``/``send_wait`` (:mod:`dflash_runtime.p2p`),
            unless another watch is already active in this process.
        fsdp: for a model managed by FSDP2 (``fully_shard``), time FSDP's own
            hooks: ``fsdp_allgather`` (its parameters' all-gather before forward
            and backward) and ``fsdp_reduce_scatter`` (the gradients' after
            backward), sync phases where they happen (FSDP's root pre-forward
            runs before the model's forward hooks: top-level there).
        stream: the CUDA stream on which ``forward``, ``backward``, ``grad_clip`` and
            ``optimizer_step`` also record a CUDA event pair (their device time in
            the record's ``gpu``, resolved by the writer thread, never by
            synchronising). ``"auto"``: the current stream of the model's device when
            CUDA is available and the model has a CUDA parameter, else none;
            ``None``: host times only.

    Returns the :class:`Instrumentation` (``remove()`` undoes everything; also a
    context manager). A disabled recorder hooks nothing and returns a no-op handle.

    Raises ``RuntimeError`` if another instrumentation is active in this process
    (remove it first), ``TypeError`` for an optimizer that is not one, or a loader
    whose class cannot be patched (a builtin type: use ``wrap_loader``).
    """
    global _active
    if not rec.enabled:
        return _NullInstrumentation()
    import torch  # lazily: `import dflash_runtime` stays standard-library only

    opts = [] if optimizer is None else (
        list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer])
    opts = [_unwrap_optimizer(o) for o in opts]
    with _active_lock:
        if _active is not None:
            msg = ("dflash_runtime.instrument: another instrumentation is active in this "
                   "process; call its remove() first")
            raise RuntimeError(msg)
        if isinstance(stream, str) and stream == "auto":
            stream = _model_stream(torch, model)
        inst = Instrumentation(rec, own_iterations=iterations, samples=samples, stream=stream)
        _active = inst
    try:
        if loader is not None:
            _hook_loader(inst, loader)
        if model is not None:
            _hook_model(inst, model)
            if fsdp and _is_fsdp2(model):
                _hook_fsdp(inst)
            if ddp and hasattr(model, "register_comm_hook") and rec._coll is None:
                try:
                    rec.watch_ddp(model)
                except RuntimeError as exc:
                    warnings.warn(f"tlog: instrument: the DDP all-reduce wait is not measured: "
                                  f"{exc}", RuntimeWarning, stacklevel=3)
        for k, opt in enumerate(opts):
            _hook_optimizer(inst, opt, last=k == len(opts) - 1)
        _hook_backward(inst, torch)
        _hook_clip(inst, torch)
        if _has_device(torch):  # without one no copy goes to a device: Tensor.to stays as it is
            _syncs.set_h2d(inst._h2d)
        if p2p:
            from . import p2p as _p2p

            if _p2p.active() is None:
                inst.p2p = _p2p.watch_p2p(rec, where=inst._wait_iteration)
        if syncs:
            inst.syncs = _syncs.catch_syncs(rec)
    except BaseException:
        inst.remove()
        raise
    return inst


def _has_device(torch: Any) -> bool:
    """Whether this process can copy a tensor to a device (CUDA, MPS or XPU)."""
    try:
        if torch.cuda.is_available():
            return True
        mps = getattr(getattr(torch, "backends", None), "mps", None)
        if mps is not None and mps.is_available():
            return True
        xpu = getattr(torch, "xpu", None)
        return bool(xpu is not None and xpu.is_available())
    except Exception:  # noqa: BLE001 - a broken device setup: time the copies anyway
        return True


def _model_stream(torch: Any, model: Any) -> Any:
    """The current CUDA stream of ``model``'s device, or None (no CUDA, no CUDA parameter)."""
    if model is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        for p in model.parameters():
            if p.is_cuda:
                return torch.cuda.current_stream(p.device)
    except Exception:  # noqa: BLE001 - a broken CUDA setup means host times only
        return None
    return None


def _hook_loader(inst: Instrumentation, loader: Any) -> None:
    cls = type(loader)
    orig_iter = cls.__iter__
    target = loader

    def __iter__(self):
        inner = orig_iter(self)
        if self is target and not inst._removed:
            return _TimedIter(inner, inst)
        return inner

    undo = _restore_attr(cls, "__iter__")
    try:
        cls.__iter__ = __iter__
    except TypeError:
        msg = (f"instrument: cannot time fetches from a {cls.__name__} (a builtin type); "
               "use `for batch in inst.wrap_loader(loader)`")
        raise TypeError(msg) from None
    inst._undo.append(undo)


def _hook_model(inst: Instrumentation, model: Any) -> None:
    """Time the model's calls as ``forward``: through its forward hooks when it
    has hooks already (FSDP2's, a user's: torch runs its hook machinery for
    them anyway), else through an instance ``forward`` that wraps its own (a
    module with a hook costs torch's slow call path, a few us a call)."""
    if _has_forward_hooks(model):
        _hook_forward(inst, model)
    else:
        _wrap_forward(inst, model)
    zero = getattr(model, "zero_grad", None)
    if zero is not None:
        _patch_instance_call(inst, model, "zero_grad", ZERO)


def _has_forward_hooks(model: Any) -> bool:
    """Whether calling ``model`` runs forward hooks (its own or global ones)."""
    from torch.nn.modules import module as nn_module

    return bool(getattr(model, "_forward_hooks", None) or getattr(model, "_forward_pre_hooks", None)
                or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


def _wrap_forward(inst: Instrumentation, model: Any) -> None:
    """``forward`` timed by an instance attribute wrapping the module's own
    (``functools.wraps``: its signature stays what ``inspect`` shows)."""
    import functools

    orig = model.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        inst._fwd_depth += 1
        it = inst._begin(FORWARD) if inst._fwd_depth == 1 and model.training else None
        try:
            return orig(*args, **kwargs)
        finally:
            inst._fwd_depth -= 1
            if it is not None:
                inst._end(it, FORWARD)

    inst._undo.append(_restore_attr(model, "forward"))
    object.__setattr__(model, "forward", forward)


def _hook_forward(inst: Instrumentation, model: Any) -> None:
    state: dict[str, Any] = {}

    def pre(module, args):
        inst._fwd_depth += 1
        if inst._fwd_depth == 1 and module.training:
            state["it"] = inst._begin(FORWARD)

    def post(module, args, output):
        inst._fwd_depth -= 1
        if inst._fwd_depth == 0:
            it = state.pop("it", None)
            if it is not None:
                inst._end(it, FORWARD)

    inst._handles.append(model.register_forward_pre_hook(pre))
    inst._handles.append(model.register_forward_hook(post, always_call=True))


def _patch_instance_call(inst: Instrumentation, obj: Any, name: str, phase: str) -> None:
    """Time ``obj.name(...)`` as ``phase`` through an instance attribute."""
    orig = getattr(obj, name)

    def timed(*args, **kwargs):
        it = inst._begin(phase)
        try:
            return orig(*args, **kwargs)
        finally:
            inst._end(it, phase)

    inst._undo.append(_restore_attr(obj, name))
    setattr(obj, name, timed)


def _hook_optimizer(inst: Instrumentation, opt: Any, *, last: bool) -> None:
    state: dict[str, Any] = {}

    def pre(optimizer, args, kwargs):
        state["it"] = inst._begin(STEP)

    def post(optimizer, args, kwargs):
        it = state.pop("it", None)
        if it is not None:
            inst._end(it, STEP)
        if last and inst._own and threading.get_ident() == inst._tid:
            inst._end_iteration()

    inst._handles.append(opt.register_step_pre_hook(pre))
    inst._handles.append(opt.register_step_post_hook(post))
    _patch_instance_call(inst, opt, "zero_grad", ZERO)


def _is_fsdp2(model: Any) -> bool:
    """Whether ``model`` or a submodule is managed by FSDP2 (``fully_shard`` makes its
    class an ``FSDPModule``)."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return False
    return any(type(m).__name__.startswith("FSDP") and hasattr(m, "reshard")
               for m in modules())


def _hook_fsdp(inst: Instrumentation) -> None:
    """Time FSDP2's own hooks (:data:`FSDP_METHODS`) as sync phases of the automatic
    iteration, children of the phase open (``forward/fsdp_allgather``), top-level
    when none is: the root's pre-forward all-gather runs before ``forward`` begins.
    A torch without these classes is left alone (nothing timed)."""
    import importlib

    for module, cls_name, meth in FSDP_METHODS:
        try:
            cls = getattr(importlib.import_module(
                f"torch.distributed.fsdp._fully_shard.{module}"), cls_name)
            orig = getattr(cls, meth)
        except (ImportError, AttributeError):
            continue
        name = FSDP_ALLGATHER if meth.startswith("pre_") else FSDP_REDUCE_SCATTER

        def wrap(orig=orig, name=name):
            def timed(*args, **kwargs):
                it = inst._wait_iteration()
                if it is None or inst._fsdp_open:   # the final callback's post_backward
                    return orig(*args, **kwargs)      # counts in the callback's time
                it.begin(name, kind="sync")
                inst._fsdp_open = True
                try:
                    return orig(*args, **kwargs)
                finally:
                    inst._fsdp_open = False
                    it.end(name)
            timed.__wrapped__ = orig
            return timed

        inst._undo.append(_restore_attr(cls, meth))
        setattr(cls, meth, wrap())


def _hook_backward(inst: Instrumentation, torch: Any) -> None:
    def wrap(orig):
        def backward(*args, **kwargs):
            inst._bwd_depth += 1
            it = inst._begin(BACKWARD) if inst._bwd_depth == 1 else None
            try:
                return orig(*args, **kwargs)
            finally:
                inst._bwd_depth -= 1
                if it is not None:
                    inst._end(it, BACKWARD)
        backward.__doc__ = orig.__doc__
        backward.__wrapped__ = orig
        return backward

    for owner in (torch.Tensor, torch.autograd):
        inst._undo.append(_restore_attr(owner, "backward"))
        owner.backward = wrap(owner.backward)


def _hook_clip(inst: Instrumentation, torch: Any) -> None:
    """Time gradient clipping however the function was imported: the public
    functions are ``_no_grad`` wrappers whose closure cell ``func`` holds the real
    function; that cell is swapped (and swapped back by ``remove``), so names bound
    by ``from torch.nn.utils import clip_grad_norm_`` before ``instrument`` are seen
    too. Where the cell is not found (another torch), the module attributes are
    patched instead."""
    import torch.nn.utils.clip_grad as cg

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        public = getattr(cg, name, None)
        if public is None:
            continue
        cell = _func_cell(public)

        def wrap(orig):
            def clip(*args, **kwargs):
                it = inst._begin(CLIP)
                try:
                    return orig(*args, **kwargs)
                finally:
                    inst._end(it, CLIP)
            clip.__name__ = clip.__qualname__ = orig.__name__
            clip.__wrapped__ = orig
            return clip

        if cell is not None:
            orig = cell.cell_contents
            cell.cell_contents = wrap(orig)

            def undo(cell=cell, orig=orig) -> None:
                cell.cell_contents = orig
            inst._undo.append(undo)
        else:
            timed = wrap(public)
            for owner in (cg, torch.nn.utils):
                if getattr(owner, name, None) is public:
                    inst._undo.append(_restore_attr(owner, name))
                    setattr(owner, name, timed)


def _func_cell(fn: Any):
    """The closure cell ``func`` of a ``_no_grad``-style wrapper, or None."""
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None)
    if code is None or not closure or "func" not in code.co_freevars:
        return None
    cell = closure[code.co_freevars.index("func")]
    inner = cell.cell_contents
    return cell if getattr(inner, "__name__", None) == fn.__name__ else None
