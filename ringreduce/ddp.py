"""ringreduce.DistributedDataParallel: torch's DDP interface over gradient buckets kept in C++.

    from ringreduce import DistributedDataParallel as DDP   # the only line that changes
    model = DDP(model, bucket_cap_mb=25)
    loss_fn(model(x), y).backward()                         # gradients averaged across ranks
    optimizer.step()

How an iteration runs:

* forward: buffers are broadcast from rank 0 (``broadcast_buffers``); the wrapped module runs;
  with ``find_unused_parameters`` the autograd graph of the output is walked to find the
  parameters it cannot reach. The C++ buckets (``ringreduce._C.Buckets``) are reset for the
  iteration and those parameters count as ready, with zeros.
* backward: a ``register_post_accumulate_grad_hook`` on every parameter tells the buckets its
  gradient is final. The buckets copy it into the bucket's flat buffer, scaled by 1/world_size,
  and say which buckets are complete; each complete bucket's all-reduce starts at once,
  asynchronously, in bucket order (so every rank issues them in the same order). The hook does
  nothing else: communication overlaps the rest of backward.
  With ``overlap=False`` the complete buckets start together, in the same order, when the last
  gradient is in instead: for hosts with no core to spare for communication, where overlapping
  only makes backward and the ring take turns on the same cores.
  On a ringreduce group, whose all-reduce averages as it reduces (``ReduceOp.AVG``), copies are
  saved: a large gradient (1 MiB or more, or the only one in its bucket) is reduced in place in
  its parameter's ``.grad``, and the smaller ones of its bucket in the flat buffer, so a bucket
  may take a few all-reduces; and with ``gradient_as_bucket_view`` the gradients, which autograd
  accumulated into the buckets themselves, are not scaled in place beforehand.
  With ``gradient_as_bucket_view``, after ``zero_grad(set_to_none=True)`` (torch's default) autograd
  hands over new gradient tensors: a bucket that holds one parameter adopts that tensor's memory
  as its buffer instead of copying the gradient in.
* the end of backward (a callback queued on the autograd engine): waits for the buckets'
  all-reduces and writes the averages to the parameters' ``.grad`` (or leaves ``.grad`` as views of
  the buckets with ``gradient_as_bucket_view``).

It works over any process group: ``ringreduce``, ``gloo`` or another.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ringreduce._registration import load_extension

__all__ = ["DistributedDataParallel", "GradBucket"]

_MIB = 1 << 20
# The first bucket is small so that the first all-reduce starts early in backward (as torch's).
_FIRST_BUCKET_BYTES = 1 * _MIB
_DEFAULT_BUCKET_CAP_MB = 25
# Parameters and buffers are broadcast at construction in chunks of at most this many bytes.
_BROADCAST_CHUNK_BYTES = 250 * _MIB
# What a comm hook may return: torch.futures.Future, or the C++ future that Work.get_future()
# and its then() hand back.
_FUTURES = (torch.futures.Future, torch._C.Future)


class GradBucket:
    """What a communication hook gets: one bucket's flat gradient buffer and what lies in it.

    The interface of torch's ``dist.GradBucket``, so that hooks written for torch's DDP (its
    fp16/bf16 compression hooks, PowerSGD) run unchanged.
    """

    def __init__(self, ddp: DistributedDataParallel, index: int):
        self._ddp = ddp
        self._index = index

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._ddp._buckets.buffer(self._index)

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._ddp._buckets.set_buffer(self._index, tensor)

    def gradients(self) -> list[torch.Tensor]:
        """Views of the buffer, one per parameter, shaped as the parameters."""
        return self._ddp._buckets.views_of(self._index)

    def parameters(self) -> list[torch.Tensor]:
        return [self._ddp._params[p] for p in self._ddp._buckets.params_of(self._index)]

    def is_last(self) -> bool:
        return self._index == self._ddp._buckets.num_buckets - 1


def _tensors_in(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            _tensors_in(getattr(obj, name), out)
    return out


def _reachable_parameters(outputs) -> set[int]:
    """ids of the leaf tensors that backward from `outputs` would reach."""
    reached, seen = set(), set()
    stack = []
    for t in _tensors_in(outputs, []):
        if not t.requires_grad:
            continue
        if t.grad_fn is None:
            reached.add(id(t))  # a parameter returned as is
        else:
            stack.append(t.grad_fn)
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # AccumulateGrad
        if variable is not None:
            reached.add(id(variable))
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return reached


class DistributedDataParallel(nn.Module):
    """Data parallelism with gradient bucketing in C++; the arguments of torch's DDP.

    Supported: ``module``, ``device_ids`` and ``output_device`` (one device; None for CPU
    modules), ``dim`` (must be 0), ``broadcast_buffers``, ``init_sync``, ``process_group``,
    ``bucket_cap_mb``, ``find_unused_parameters``, ``gradient_as_bucket_view``, ``static_graph``.
    ``state_dict()`` keys carry the ``module.`` prefix, as torch's DDP's do, so checkpoints move
    between the two.

    ringreduce's own: ``overlap`` (True, the default: a bucket's all-reduce starts as soon as its
    last gradient is in, while backward goes on; False: the complete buckets start together, in
    order, when backward has produced the last gradient). Every rank must pass the same value.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids=None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        init_sync: bool = True,
        process_group=None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        overlap: bool = True,
        **unsupported: Any,
    ):
        super().__init__()
        for name, value in unsupported.items():
            if value not in (None, False):
                raise NotImplementedError(
                    f"ringreduce DistributedDataParallel: argument {name}={value!r} of torch's DDP "
                    "is not supported")
        if dim != 0:
            raise NotImplementedError("ringreduce DistributedDataParallel: only dim=0 is supported")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("ringreduce DistributedDataParallel: device_ids can hold one device "
                             "at most (one device per process), as for torch's DDP")
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self._rank = dist.get_rank(self.process_group)
        self._world = dist.get_world_size(self.process_group)

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._buffers_list = [b for b in module.buffers()]
        self._check_same_parameters(named)
        self.overlap = bool(overlap)
        if init_sync:
            self._broadcast_from_rank0([p.detach() for p in module.parameters()] + self._buffers_list)

        cap = _DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.bucket_bytes_cap = int(cap * _MIB)
        # ringreduce's all-reduce divides each reduced slice while it is still in cache; other
        # backends (gloo has no AVG) get gradients scaled on their way into the buckets.
        self._group_averages = dist.get_backend(self.process_group) == "ringreduce"
        self._buckets_average = False  # this iteration's buckets are reduced with AVG
        # The parameters themselves (not detached copies): the buckets read and set their .grad.
        self._buckets = load_extension().Buckets(
            self._params, min(_FIRST_BUCKET_BYTES, self.bucket_bytes_cap),
            self.bucket_bytes_cap)

        self._hook: Callable | None = None
        self._hook_state: Any = None
        self._pending: list = []  # (bucket, [Work] or [Future]) started in this iteration, in order
        self._deferred: list[int] = []  # complete buckets not started yet (overlap=False)
        self._ready_at_start: list[int] = []  # gradients in when each bucket started
        self._callback_queued = False
        self._locally_unused: list[int] = []
        self._static_unused: list[int] | None = None
        self._iterations = 0
        # For the overlap test: at each bucket start, how many of its started predecessors had
        # already completed their all-reduce when the last gradient arrived.
        self._completed_before_last_grad = 0
        self._waited_s = 0.0  # time the end of the last backward waited for its all-reduces

        this = weakref.ref(self)

        def make_hook(index):
            def hook(_param):
                ddp = this()
                if ddp is not None:
                    ddp._grad_ready(index)
            return hook

        self._hook_handles = [p.register_post_accumulate_grad_hook(make_hook(i))
                              for i, p in enumerate(self._params)]

    # ---- construction ---------------------------------------------------------------

    def _check_same_parameters(self, named):
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        everyone = [None] * self._world
        dist.all_gather_object(everyone, mine, group=self.process_group)
        reference = everyone[0]
        for rank, theirs in enumerate(everyone):
            if theirs == reference:
                continue
            for i in range(max(len(theirs), len(reference))):
                a = reference[i] if i < len(reference) else None
                b = theirs[i] if i < len(theirs) else None
                if a != b:
                    raise RuntimeError(
                        f"ringreduce DistributedDataParallel: rank {self._rank}: the models differ "
                        f"across ranks: parameter #{i} is {_describe(a)} on rank 0 but {_describe(b)} "
                        f"on rank {rank}")

    def _broadcast_from_rank0(self, tensors):
        """Rank 0's values into every rank's tensors: a few large broadcasts per dtype."""
        if self._world == 1 or not tensors:
            return
        src = dist.get_global_rank(self.process_group, 0)
        by_kind: dict = {}
        for t in tensors:
            by_kind.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            for group in by_kind.values():
                chunks, cur, size = [], [], 0
                for t in group:
                    nbytes = t.numel() * t.element_size()
                    if cur and size + nbytes > _BROADCAST_CHUNK_BYTES:
                        chunks.append(cur)
                        cur, size = [], 0
                    cur.append(t)
                    size += nbytes
                chunks.append(cur)
                for chunk in chunks:
                    flat = torch._utils._flatten_dense_tensors(chunk)
                    dist.broadcast(flat, src=src, group=self.process_group)
                    for dst, val in zip(chunk, torch._utils._unflatten_dense_tensors(flat, chunk)):
                        dst.copy_(val)

    # ---- the torch DDP interface ---------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self._buffers_list:
            self._broadcast_from_rank0(self._buffers_list)
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            self._finish_previous_iteration()
        out = self.module(*inputs, **kwargs)
        if sync:
            self._start_iteration(out)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally in ``.grad``; the next synchronised backward reduces the
        accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """``hook(state, bucket) -> torch.futures.Future`` replaces the all-reduce of each bucket;
        the future's value (a tensor, or a list holding one) is the reduced buffer. As with torch's
        DDP the buffer then holds the gradients' sum, not their average: the hook divides (see
        ``ringreduce.comm_hooks``). Register once, before the first backward."""
        if self._hook is not None:
            raise RuntimeError("ringreduce DistributedDataParallel: register_comm_hook can only be "
                               "called once")
        if self._iterations > 0:
            raise RuntimeError("ringreduce DistributedDataParallel: register_comm_hook must be "
                               "called before the first backward")
        if not callable(hook):
            raise TypeError("ringreduce DistributedDataParallel: the comm hook must be callable")
        self._hook, self._hook_state = hook, state

    # ---- one iteration -------------------------------------------------------------------

    def _finish_previous_iteration(self):
        # A forward whose backward never ran (or was not reduced): its started all-reduces are
        # waited for, so that every rank's group stays in step.
        self._start_deferred()  # as started by a rank that overlaps: at the same point in the sequence
        if self._pending:
            for _, handles in self._pending:
                for handle in handles:
                    handle.wait()
            self._pending = []

    def _start_iteration(self, out):
        unused: list[int] = []
        if self.find_unused_parameters or self.static_graph:
            if self.static_graph and self._static_unused is not None:
                unused = self._static_unused
            else:
                reached = _reachable_parameters(out)
                unused = [i for i, p in enumerate(self._params) if id(p) not in reached]
                if self.static_graph:
                    self._static_unused = unused
        elif not any(t.requires_grad for t in _tensors_in(out, [])):
            return  # nothing to backward through: no iteration
        self._locally_unused = unused
        self._callback_queued = False
        self._completed_before_last_grad = 0
        self._deferred = []
        self._ready_at_start = []
        average = self._hook is None and self._group_averages
        # A comm hook gets the plain sum of gradients and scales as it likes (as in torch's DDP).
        scale = 1.0 if self._hook is not None else 1.0 / self._world
        self._buckets_average = average and self.gradient_as_bucket_view
        if self._buckets_average:
            scale = 1.0
        solo_in_place = average and not self.gradient_as_bucket_view
        for b in self._buckets.prepare(scale, unused, solo_in_place):
            self._start_bucket(b)
        if self._buckets.num_ready == self._buckets.num_params:
            self._start_deferred()  # nothing is left for backward to produce

    def _grad_ready(self, index: int):
        if not self.require_backward_grad_sync or not self._buckets.in_iteration:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        started = self._buckets.mark_ready(index, self.gradient_as_bucket_view)
        last = self._buckets.num_ready == self._buckets.num_params
        if last:
            self._completed_before_last_grad = sum(
                1 for _, hs in self._pending if all(_done(h) for h in hs))
        for b in started:
            self._start_bucket(b)
        if last:
            self._start_deferred()

    def _start_bucket(self, b: int):
        """Starts bucket b's all-reduce now, or (overlap=False) once the last gradient is in."""
        if self.overlap:
            self._launch(b)
        else:
            self._deferred.append(b)

    def _start_deferred(self):
        deferred, self._deferred = self._deferred, []
        for b in deferred:
            self._launch(b)

    def _launch(self, b: int):
        self._ready_at_start.append(self._buckets.num_ready)
        if self._hook is None:
            # One all-reduce per segment (see _start_iteration), the whole buffer otherwise.
            handles = [dist.all_reduce(t, op=dist.ReduceOp.AVG if solo or self._buckets_average
                                       else dist.ReduceOp.SUM,
                                       group=self.process_group, async_op=True)
                       for t, solo in self._buckets.reduce_targets(b)]
        else:
            handle = self._hook(self._hook_state, GradBucket(self, b))
            if not isinstance(handle, _FUTURES):
                raise TypeError("ringreduce DistributedDataParallel: a comm hook must return a "
                                f"torch.futures.Future, got {type(handle).__name__}")
            handles = [handle]
        self._pending.append((b, handles))

    def _end_of_backward(self):
        self._callback_queued = False
        missing = self._buckets.pending_params()
        if missing and not (self.find_unused_parameters or self.static_graph):
            self._finish_previous_iteration()
            names = [self._param_names[i] for i in missing]
            raise RuntimeError(
                f"ringreduce DistributedDataParallel: rank {self._rank}: these parameters received "
                f"no gradient in this backward, so their buckets could not be reduced: {names}. "
                "If your model has parameters that some forward passes do not use, pass "
                "find_unused_parameters=True (as with torch's DDP); also check that the whole "
                "output of forward takes part in the loss.")
        for i in missing:  # reachable, but backward produced no gradient (find_unused mode)
            self._locally_unused.append(i)
            for b in self._buckets.mark_unused(i):
                self._start_bucket(b)
        self._start_deferred()
        used: list[int] = []
        if self.find_unused_parameters or self.static_graph:
            # A parameter unused here may be used on another rank: it gets the average. One
            # unused everywhere keeps its .grad as it was (None stays None), as in torch's DDP.
            flags = torch.ones(len(self._params), dtype=torch.int32)
            if self._locally_unused:
                flags[torch.tensor(self._locally_unused, dtype=torch.long)] = 0
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.process_group)
            used = flags.to(torch.uint8).tolist()
        # Each bucket goes back to the gradients as soon as its all-reduce is done, while the
        # later buckets are still being reduced.
        waited = 0.0
        for b, handles in self._pending:
            t0 = time.perf_counter()
            if self._hook is not None:
                value = handles[0].wait()
                waited += time.perf_counter() - t0
                if isinstance(value, (list, tuple)):
                    value = value[0]
                buf = self._buckets.buffer(b)
                if value.data_ptr() != buf.data_ptr():
                    with torch.no_grad():
                        buf.copy_(value)
            else:
                for handle in handles:
                    handle.wait()
                waited += time.perf_counter() - t0
            self._buckets.write_back(b, used, self.gradient_as_bucket_view)
        self._pending = []
        self._waited_s = waited
        self._buckets.end_iteration()
        self._iterations += 1

    # ---- introspection ---------------------------------------------------------------

    def bucket_assignment(self) -> list[list[str]]:
        """Parameter names per bucket, in the order the buckets are reduced."""
        return [[self._param_names[p] for p in self._buckets.params_of(b)]
                for b in range(self._buckets.num_buckets)]

    def overlap_record(self) -> dict:
        """What the last iteration did while backward ran: whether it overlapped, for each bucket
        how many gradients were in when its all-reduce started, how many all-reduces had already
        completed when the last gradient arrived, and how long the end of backward waited for the
        rest."""
        return {
            "overlap": self.overlap,
            "params": len(self._params),
            "ready_when_started": list(self._ready_at_start),
            "completed_before_last_gradient": self._completed_before_last_grad,
            "waited_s": self._waited_s,
        }


def _done(handle) -> bool:
    if isinstance(handle, _FUTURES):
        return handle.done()
    return handle.is_completed()


def _describe(entry) -> str:
    if entry is None:
        return "absent"
    name, shape, dtype = entry
    return f"'{name}' of shape {list(shape)} and dtype {dtype}"
