"""all_reduce through torch.distributed on the backend under test.

The sweep: world size 1..4 x element count {0, 1, world-1, 1009, 2^20+3} x every dtype x
every op the dtype supports (reference.ops_for) x {sync, async + work.wait(), async +
work.get_future().wait()} (the last not at 2^20+3), in place.  One pool call per (world
size, dtype) runs all of that dtype's cases; a failure names each bad case as
"world=W count=N dtype=D op=O mode=M".

Every case draws fresh random inputs (reference.make_input) and checks:
  (a) against a float64 (complex128; exact int64 for integers and bool) reference that the
      checking rank rebuilds from every rank's seed, with the per-dtype tolerances of
      reference.RTOL (fp16 1e-2, bf16 2e-2, fp32 1e-5 of sum|x_i|; integers exact);
  (b) against gloo on the same inputs where gloo can do the dtype/op (reference.gloo_supports
      lists what torch 2.13's gloo cannot: int16, AVG on integers, PREMUL_SUM, complex
      PRODUCT), within twice the tolerance;
  (c) bit-identical results on every rank (hashes of the result bytes).
The checking rank rotates over the cases so the reference work is spread over the ranks.

Also: non-contiguous, 0-d, 3-D and empty tensors (the result lands in the caller's view
and the rest of its base is untouched), and the sweep again at world 2 and 4 with tiny
slices (RINGREDUCE_SLICE_BYTES=64, RINGREDUCE_SLOTS=2) so that slicing and pipelining run
at small counts.
"""

import pytest

import harness
import reference
from reference import DTYPE_NAMES, gloo_supports, ops_for

MODES = ("sync", "async", "future")
BIG = 2**20 + 3
TINY_SLICES = {"RINGREDUCE_SLICE_BYTES": "64", "RINGREDUCE_SLOTS": "2"}
# Each rank gives up on a call after this many exceptions (a broken group would otherwise
# cost one op timeout per remaining case).
MAX_EXCEPTIONS = 5


def sweep_counts(world):
    return list(dict.fromkeys([0, 1, world - 1, 1009, BIG]))


def tiny_counts(world):
    # 64-byte slices hold 4..64 elements: cover a partial slice, slice and chunk
    # boundaries (+-1), a prime, and hundreds of slices per chunk.
    return list(dict.fromkeys([0, 1, world - 1, 16 * world - 1, 16 * world + 1, 1009, 12_289]))


# --------------------------------------------------------------------------------------
# rank side


LAYOUTS = {
    # name: (shape of the base tensor, view of it that is reduced)
    "transposed-2d": ((37, 29), lambda b: b.t()),
    "strided-slice": ((3001,), lambda b: b[1::3]),
    "2d-block": ((40, 12), lambda b: b[::2, 3:9]),
    "0d-scalar": ((), lambda b: b),
    "3d": ((3, 5, 7), lambda b: b),
    "3d-permuted": ((3, 5, 7), lambda b: b.permute(2, 0, 1)),
    "empty": ((0,), lambda b: b),
    "empty-3d": ((3, 0, 2), lambda b: b),
}


def _build(ctx, name, rank, dtype_name, op, count, layout):
    gen = ctx.gen("input", name, rank=rank)
    if layout is None:
        base = reference.make_input(gen, dtype_name, count, op, ctx.world_size)
        return base, base
    shape, view = LAYOUTS[layout]
    base = reference.make_input(gen, dtype_name, None, op, ctx.world_size, shape=shape)
    return base, view(base)


def _tensor_key(x):
    return x.data_ptr(), tuple(x.shape), x.stride(), x.dtype


def issue_allreduce(t, dtype_name, op, factor, mode, group):
    """all_reduce ``t`` in place in one of the three modes; returns a problem or None.

    Complex PRODUCT goes through ProcessGroup.allreduce: dist.all_reduce refuses it in
    Python (torch's supports_complex()) before any backend sees it.
    """
    import torch
    import torch.distributed as dist

    if dtype_name in reference.COMPLEX_NAMES and op == "PRODUCT":
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.PRODUCT
        work = group.allreduce([t], opts)
        expect = t
    else:
        rop = reference.reduce_op(op, factor)
        if mode == "sync":
            r = dist.all_reduce(t, op=rop, group=group)
            return None if r is None else f"sync all_reduce returned {r!r}, expected None"
        work = dist.all_reduce(t, op=rop, group=group, async_op=True)
        # dist.all_reduce hands complex tensors to the backend as view_as_real(t).
        expect = torch.view_as_real(t) if t.is_complex() else t
    if mode == "future":
        res = work.get_future().wait()
        if not isinstance(res, list) or len(res) != 1 or not isinstance(res[0], torch.Tensor):
            return f"work.get_future().wait() returned {res!r}, expected [output tensor]"
        got, want = _tensor_key(res[0]), _tensor_key(expect)
        if got != want:
            return f"future's tensor is not the output tensor: data_ptr/shape/stride/dtype {got} vs {want}"
    else:
        ok = work.wait()
        if ok is not True:
            return f"work.wait() returned {ok!r}, expected True"
        # (Not checked after the future's wait: gloo completes the future before the
        # Work, and torch does not promise an order.)
        if not work.is_completed():
            return "work.is_completed() is False after work.wait()"
    return None


def _gloo_allreduce(t, op, factor, gloo):
    import torch.distributed as dist

    dist.all_reduce(t, op=reference.reduce_op(op, factor), group=gloo)


def _case_factor(ctx, name):
    import torch

    g = ctx.gen("factor", name)
    f = 0.25 + 1.5 * torch.rand(1, generator=g, dtype=torch.float64).item()
    return -f if torch.randint(0, 2, (1,), generator=g).item() else f


def run_cases(ctx, dtype_name, cases, with_gloo=True):
    """Run ``cases`` = [(count, op, mode, layout)] on this rank.

    Returns (failures, digests): failures seen by this rank (strings naming the case);
    digests {case name: hash of the result bytes} for the across-ranks comparison.
    """
    import torch

    world, rank = ctx.world_size, ctx.rank
    failures, digests, n_exc = [], {}, 0
    for i, (count, op, mode, layout) in enumerate(cases):
        shape = f"layout={layout}" if layout else f"count={count}"
        name = f"world={world} {shape} dtype={dtype_name} op={op} mode={mode}"
        factor = _case_factor(ctx, name) if op == "PREMUL_SUM" else None
        base, t = _build(ctx, name, rank, dtype_name, op, count, layout)
        base_before = base.clone()
        mine = t.clone()
        try:
            problem = issue_allreduce(t, dtype_name, op, factor, mode, ctx.group)
        except Exception as e:  # keep going: usually every rank raises alike
            n_exc += 1
            failures.append(f"{name}: rank {rank} raised {type(e).__name__}: {str(e).strip()[:500]}")
            if n_exc >= MAX_EXCEPTIONS:
                raise AssertionError(f"rank {rank}: {n_exc} exceptions, giving up; failures so far:\n"
                                     + "\n".join(failures)) from e
            continue
        if problem:
            failures.append(f"{name}: rank {rank}: {problem}")
        if base is not t:
            # The elements of the base outside the view must be untouched (bit for bit).
            mask = torch.ones(base.shape, dtype=torch.bool)
            LAYOUTS[layout][1](mask).fill_(False)
            if harness.digest(base[mask]) != harness.digest(base_before[mask]):
                failures.append(f"{name}: rank {rank}: elements of the base outside the view were modified")
        digests[name] = harness.digest(t)

        checker = i % world == rank
        if checker:
            inputs = [mine if r == rank else _build(ctx, name, r, dtype_name, op, count, layout)[1].clone()
                      for r in range(world)]
            ref = reference.reference(inputs, dtype_name, op, factor)
            scale = None if reference.exact_kind(dtype_name, op) else reference.float_scale(inputs, dtype_name, op, factor)
            msg = reference.compare(t, ref, dtype_name, op, scale)
            if msg:
                failures.append(f"{name}: vs reference: {msg}")
        if with_gloo and gloo_supports(dtype_name, op):
            # gloo treats a non-contiguous tensor's memory as contiguous (it wrote the
            # strided-slice result over the wrong elements in a probe): give it a copy.
            g = mine.clone(memory_format=torch.contiguous_format)
            _gloo_allreduce(g, op, factor, ctx.gloo)
            if dtype_name == "bool":  # gloo's bool SUM leaves bytes of 2: normalise
                g = g.view(torch.uint8) != 0
            if checker:
                msg = reference.compare(t, g, dtype_name, op, scale, slack=2.0)
                if msg:
                    failures.append(f"{name}: vs gloo: {msg}")
    return failures, digests


def _rank_sweep(ctx, dtype_name, counts, modes):
    standin = harness.standin()
    # The large count in the synchronous and the async mode, not again through the future: the
    # future's checks do not depend on the size, and the large cases were most of the sweep's time.
    cases = [
        (count, op, mode, None)
        for count in counts
        for op in ops_for(dtype_name)
        if not (standin and reference.standin_skip(dtype_name, op))
        for mode in modes
        if not (count == BIG and mode == "future")
    ]
    return run_cases(ctx, dtype_name, cases)


# gloo writes these as if they were contiguous: skipped when gloo stands in.
GLOO_BROKEN_LAYOUTS = {"strided-slice", "2d-block"}


def _rank_layouts(ctx, dtype_name, ops):
    standin = harness.standin()
    cases = [
        (None, op, mode, layout)
        for layout in LAYOUTS
        if not (standin and layout in GLOO_BROKEN_LAYOUTS)
        for op in ops
        if not (standin and reference.standin_skip(dtype_name, op))
        for mode in MODES
    ]
    return run_cases(ctx, dtype_name, cases)


# --------------------------------------------------------------------------------------
# parent side


def _skip_int16_on_gloo(standin, dtype_name):
    if standin and dtype_name == "int16":
        pytest.skip("gloo stand-in: gloo has no int16")


SWEEP = [(w, d) for w in (1, 2, 3, 4) for d in DTYPE_NAMES]


@pytest.mark.parametrize("world,dtype_name", SWEEP, ids=[f"world{w}-{d}" for w, d in SWEEP])
def test_allreduce_sweep(ranks, standin, world, dtype_name):
    _skip_int16_on_gloo(standin, dtype_name)
    pool = ranks(world)
    harness.check_results(pool.run(_rank_sweep, dtype_name, sweep_counts(world), MODES, timeout=240))


TINY_DTYPES = ["float32", "float16", "bfloat16", "int8", "int64", "bool", "complex128"]
TINY = [(w, d) for w in (2, 4) for d in TINY_DTYPES]


@pytest.mark.parametrize("world,dtype_name", TINY, ids=[f"world{w}-{d}" for w, d in TINY])
def test_allreduce_sweep_tiny_slices(ranks, standin, world, dtype_name):
    pool = ranks(world, env=TINY_SLICES)
    harness.check_results(pool.run(_rank_sweep, dtype_name, tiny_counts(world), MODES, timeout=240))


LAYOUT_DTYPES = {
    "float32": ["SUM", "MAX"],
    "float16": ["SUM", "PRODUCT"],
    "int32": ["SUM", "MIN", "BXOR"],
    "bool": ["SUM", "BAND"],
    "complex64": ["SUM", "AVG"],
}
LAYOUT_CASES = [(w, d) for w in (1, 2, 4) for d in LAYOUT_DTYPES]


@pytest.mark.parametrize("world,dtype_name", LAYOUT_CASES, ids=[f"world{w}-{d}" for w, d in LAYOUT_CASES])
def test_allreduce_layouts(ranks, world, dtype_name):
    """Non-contiguous views (transposed, strided slice, 2-D block, permuted 3-D), 0-d,
    3-D and empty tensors: the result lands in the caller's tensor, the rest of its
    base is untouched, and the future hands back the caller's tensor."""
    pool = ranks(world)
    harness.check_results(pool.run(_rank_layouts, dtype_name, LAYOUT_DTYPES[dtype_name], timeout=120))
