"""ringreduce: ring all-reduce collectives for PyTorch, as a torch.distributed backend.

    import torch.distributed as dist
    dist.init_process_group("ringreduce")   # registered when torch is imported, or by importing us
    dist.all_reduce(tensor)

Importing this package registers the backend (it is idempotent). The compiled extension,
``ringreduce._C``, is loaded when the first ringreduce process group is created.
"""

from ringreduce._registration import BACKEND_NAME, is_available, load_extension, register
from ringreduce.barrier import monitored_barrier
from ringreduce.ddp import DistributedDataParallel, GradBucket
from ringreduce.direct import all_gather_into_tensor_, all_reduce_
from ringreduce.flight import dump as dump_flight_recorder

__all__ = ["BACKEND_NAME", "DistributedDataParallel", "GradBucket", "all_gather_into_tensor_",
           "all_reduce_", "dump_flight_recorder", "is_available", "load_extension",
           "monitored_barrier", "register", "__version__"]
__version__ = "0.1.0"

register()
