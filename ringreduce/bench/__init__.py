"""Bandwidth benchmark in the style of nccl-tests: ringreduce beside gloo, side by side in one run.

    python -m ringreduce.bench                     # 2 local ranks, 1K..64M, float32 sum
    python -m ringreduce.bench -g 4 -d bfloat16 -o max
    torchrun --nproc-per-node 4 -m ringreduce.bench
    python -m ringreduce.bench --device cuda -g 2  # CUDA tensors, every rank on one GPU

Both backends run in the same processes and alternate at every size, so machine noise hits both alike:
machines are noisy, and only ratios measured side by side are worth quoting. Barriers and the
bookkeeping reductions go through a separate gloo group, so a measured backend runs nothing but the
measured collective. The run also measures the machine's aggregate copy bandwidth, which bounds any
same-host collective, and prints how close ringreduce gets to that floor.

With --device cuda the buffers are CUDA tensors and rank r uses GPU r % (GPUs visible): with one GPU,
every rank shares it, and the floor is that GPU's copy bandwidth against the bytes all ranks move
through its memory together. NCCL cannot put two ranks on one GPU, so it is not a column; instead
rank 0 times it at world size 1 after the table, in a process of its own, as the launch-overhead floor.

The package, one responsibility a module, each depending only on those above it:
    sizes        the size parser and formatter (also the benchmarks/ scripts')
    collectives  what each collective is: how to run it, check it, its busbw factor, its byte model
    timing       the timing loop and the figures the ranks agree on
    floor        the memory floor's unit, the machine's copy bandwidth
    cuda         the GPU's copy and kernel bandwidth, NCCL at world size 1
    report       the table, the summary lines, JSON and the plot (rank 0)
    spread       with --launches N > 1: each size's best, median and worst launch (the parent)
    cli          the options and the driver; `python -m ringreduce.bench` runs its main()

With --launches N (N > 1) every backend runs in N launches of its own instead, each a fresh spawn
of the ranks (new processes, a new rendezvous) that measures every size, alternating between the
backends (ringreduce 1, gloo 1, ringreduce 2, ...); the parent then prints per size and backend the
best, median and worst launch, so that one draw of a noisy machine is not taken for the figure.
"""

from .cli import (
    BUILD_HINT,
    BackendUnavailable,
    build_parser,
    ensure_backend,
    main,
    parse_args,
    run_launches,
    run_rank,
    verify_same_plan,
)
from .collectives import (
    _COMBINE,
    CHECK_CHUNK,
    COLLECTIVES,
    DTYPES,
    PROG,
    REDOPS,
    SETS,
    Collective,
    allreduce_busbw_factor,
    check_all_reduce,
    check_input,
    expected_result,
    ringreduce_allreduce_bytes,
    ringreduce_cuda_allreduce_bytes,
)
from .cuda import Gpu, measure_gpu, nccl_floor
from .floor import copy_bytes, measure_copy_bandwidth
from .report import Report
from ..sizes import format_size, parse_size, size_arg, size_sweep
from .spread import Launch, SizeSpread, Spread
from .timing import Result, SetResults, iterations, probe_support, safety_cost, time_collective
