"""Direct ops for inference loops: one dispatcher call from Python to the group's backend.

    import ringreduce
    ringreduce.all_reduce_(t)                    # in place, the default group, sum
    ringreduce.all_reduce_(t, op="max", group=tp_group)
    ringreduce.all_gather_into_tensor_(out, t, group=tp_group)

They are ``torch.ops.ringreduce.all_reduce_(Tensor(a!) t, str op, str group) -> ()`` and
``torch.ops.ringreduce.all_gather_into_tensor_(Tensor(a!) out, Tensor input, str group) -> ()``
(a group's ``group_name``, or "" for the default group), with Meta kernels, so torch.compile
traces them with ``fullgraph=True``. They run the backend's own entry points: the same checks,
errors, flight recorder, deadlines and results as ``dist.all_reduce`` on the same group, with
which they may be mixed. CPU tensors, every dtype and op the backend takes.
"""

from __future__ import annotations

import torch

from ringreduce._registration import load_extension

_OPS = {"sum", "avg", "product", "prod", "min", "max", "band", "bor", "bxor"}
_loaded = False
# The ops' dispatcher entries (each OpOverload's own callable), resolved at the first call. Called
# straight, they skip the Python layers of torch.ops (the packet's and the overload's __call__,
# a third of a small op's time from Python: docs/results.md) and do exactly what those layers
# call: the dispatcher, with autograd, Python modes, subclasses and the profiler as before.
# Dynamo cannot trace that callable, so while torch.compile traces a caller the wrappers call
# torch.ops instead, which it puts into the graph. They ask torch.compiler.is_compiling(), which
# Dynamo folds to True without a guard; reading its flag (torch.compiler._is_compiling_flag) would
# save 70 ns a call, but Dynamo guards on a module attribute's value, which is False whenever the
# guards run, so every call of a compiled caller recompiled it.
_eager = None
_is_compiling = torch.compiler.is_compiling


def _ops():
    global _loaded
    if not _loaded:
        load_extension()  # registers torch.ops.ringreduce
        _loaded = True
    return torch.ops.ringreduce


def _resolve():
    global _eager
    ops = _ops()
    _eager = (ops.all_reduce_.default._op, ops.all_gather_into_tensor_.default._op)
    return _eager


def _op_name(op) -> str:
    if isinstance(op, str):
        name = op.lower()
    else:  # a torch.distributed.ReduceOp (or its RedOpType)
        name = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
    if name not in _OPS:
        raise ValueError(f"ringreduce.all_reduce_: op {op!r} is not one of sum, avg, product, min, "
                         "max, band, bor, bxor")
    return name


def _group_name(group) -> str:
    return "" if group is None else group.group_name


def all_reduce_(tensor: torch.Tensor, op="sum", group=None) -> None:
    """All-reduce ``tensor`` in place over ``group`` (the default group when None)."""
    # The common call (op "sum", the default group) costs one dict-free check before the op.
    name = op if op.__class__ is str and op in _OPS else _op_name(op)
    group_name = "" if group is None else group.group_name
    if _is_compiling():
        _ops().all_reduce_(tensor, name, group_name)
    else:
        (_eager or _resolve())[0](tensor, name, group_name)


def all_gather_into_tensor_(output: torch.Tensor, input: torch.Tensor, group=None) -> None:
    """Gather every rank's ``input`` into ``output`` (rank order), as dist.all_gather_into_tensor."""
    if _is_compiling():
        _ops().all_gather_into_tensor_(output, input, _group_name(group))
    else:
        (_eager or _resolve())[1](output, input, _group_name(group))
