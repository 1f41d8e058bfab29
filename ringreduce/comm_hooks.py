"""Communication hooks for ringreduce.DistributedDataParallel (and torch's DDP: same interface).

    from ringreduce import comm_hooks
    model.register_comm_hook(None, comm_hooks.fp16_compress_hook)   # None: the DDP's own group

A hook gets a bucket whose buffer holds the sum of this rank's gradients (not yet divided by the
world size) and returns a future of the reduced buffer. These two send the bucket over the wire
in a 16-bit format, halving the bytes moved: the buffer is divided by the world size first (so
the sum cannot overflow where the average would not), cast, all-reduced, and cast back into the
bucket. float16 keeps 10 bits of mantissa but overflows above 65504; bfloat16 keeps float32's
range with 7 bits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


def _group(process_group):
    return process_group if process_group is not None else dist.group.WORLD


def allreduce_hook(process_group, bucket) -> torch.futures.Future:
    """The average, in the bucket's own dtype: what DDP does without a hook."""
    group = _group(process_group)
    buf = bucket.buffer()
    buf.div_(dist.get_world_size(group))
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _compressed(wire_dtype, process_group, bucket) -> torch.futures.Future:
    group = _group(process_group)
    buf = bucket.buffer()
    wire = buf.to(wire_dtype).div_(dist.get_world_size(group))  # owned by this hook call

    def unpack(fut):
        buf.copy_(fut.value()[0])
        return buf

    return dist.all_reduce(wire, group=group, async_op=True).get_future().then(unpack)


def fp16_compress_hook(process_group, bucket) -> torch.futures.Future:
    """Gradients reduced in float16."""
    return _compressed(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group, bucket) -> torch.futures.Future:
    """Gradients reduced in bfloat16."""
    return _compressed(torch.bfloat16, process_group, bucket)
