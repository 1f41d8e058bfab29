"""``monitored_barrier`` for ringreduce groups.

torch's ``dist.monitored_barrier`` accepts gloo groups only (a check in torch's Python, before any
backend is asked). The process group's own ``monitored_barrier`` method reaches the backend, and
ringreduce implements it: this function is torch's, with the same arguments, for any group whose
backend implements it.
"""

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group, _get_default_timeout


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """Like ``torch.distributed.monitored_barrier``: every rank of ``group`` must arrive within
    ``timeout`` (the group's timeout by default); otherwise rank 0 raises naming the first rank
    that did not arrive ("Rank 2 failed to pass monitoredBarrier in 1000 ms"), or all of them with
    ``wait_all_ranks=True``, and the others raise pointing at rank 0's error."""
    if group is None:
        group = _get_default_group()
    if timeout is None:
        timeout = _get_default_timeout(dist.get_backend(group))
    elif isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
