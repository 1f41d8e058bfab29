"""Soak: a thousand async collectives of random kinds, sizes and dtypes on 4 ranks,
many in flight at once, each result checked.

Every rank draws the same plan from the call's seed, so all ranks issue the same ops in the same
order. Inputs are integer-valued and built from (op, rank) by a formula, so each rank computes the
exact expected result of every op locally. Runs over shared memory in the main pass and over TCP
in the TCP pass of `make test`.
"""

import os

import harness

WORLD = 4
OPS = int(os.environ.get("RINGREDUCE_SOAK_OPS", "1000"))
IN_FLIGHT = 24
KINDS = ["all_reduce_sum", "all_reduce_max", "broadcast", "all_gather", "reduce_scatter", "barrier"]
DTYPES = ["float32", "float64", "int32", "int64", "bfloat16", "float16"]


def _input(torch, dtype, n, op_index, rank):
    # Small integers (exact in every dtype above, also when summed over 4 ranks).
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7 + op_index * 13 + rank * 29) % 23 - 11).to(dtype)


def _rank_soak(ctx, ops, in_flight):
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    plan = ctx.gen("soak-plan")  # the same on every rank
    failures = []
    pending = []  # (work, check)
    counts = {k: 0 for k in KINDS}

    def settle(keep):
        while len(pending) > keep:
            work, check = pending.pop(0)
            work.wait()
            err = check()
            if err:
                failures.append(err)

    for k in range(ops):
        kind = KINDS[int(torch.randint(0, len(KINDS), (1,), generator=plan))]
        dtype = getattr(torch, DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=plan))])
        # Mostly small, some large: sizes spread over 0 .. 256K elements on a log scale.
        n = int(2 ** (torch.rand(1, generator=plan).item() * 18)) - 1
        root = int(torch.randint(0, world, (1,), generator=plan))
        counts[kind] += 1
        name = f"op {k} ({kind}, {n} x {dtype}, root {root})"
        if kind.startswith("all_reduce"):
            t = _input(torch, dtype, n, k, rank)
            ins = [_input(torch, torch.float64, n, k, r) for r in range(world)]
            want = sum(ins) if kind.endswith("sum") else torch.stack(ins).amax(0) if n else ins[0]
            op = dist.ReduceOp.SUM if kind.endswith("sum") else dist.ReduceOp.MAX
            w = dist.all_reduce(t, op=op, async_op=True)
            check = (lambda t=t, want=want, name=name:
                     None if torch.equal(t.double(), want) else f"{name}: wrong result")
        elif kind == "broadcast":
            t = _input(torch, dtype, n, k, rank)
            want = _input(torch, dtype, n, k, root)
            w = dist.broadcast(t, src=root, async_op=True)
            check = lambda t=t, want=want, name=name: None if torch.equal(t, want) else f"{name}: wrong"
        elif kind == "all_gather":
            out = torch.full((world * n,), -99, dtype=dtype)
            w = dist.all_gather_into_tensor(out, _input(torch, dtype, n, k, rank), async_op=True)
            want = torch.cat([_input(torch, dtype, n, k, r) for r in range(world)])
            check = lambda out=out, want=want, name=name: None if torch.equal(out, want) else f"{name}: wrong"
        elif kind == "reduce_scatter":
            out = torch.full((n,), -99, dtype=dtype)
            w = dist.reduce_scatter_tensor(out, _input(torch, dtype, world * n, k, rank), async_op=True)
            total = sum(_input(torch, torch.float64, world * n, k, r) for r in range(world))
            want = total[rank * n:(rank + 1) * n]
            check = (lambda out=out, want=want, name=name:
                     None if torch.equal(out.double(), want) else f"{name}: wrong result")
        else:
            w = dist.barrier(async_op=True)
            check = lambda: None
        pending.append((w, check))
        settle(in_flight)
    settle(0)
    # Still in step: one more all-reduce every rank agrees on.
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((5,), float(sum(range(world))))):
        failures.append(f"the all-reduce after the soak gave {t.tolist()}")
    return failures[:20], {"ops issued per kind": str(sorted(counts.items()))}


def test_soak_a_thousand_mixed_async_collectives(ranks, standin):
    pool = ranks(WORLD)
    results = pool.run(_rank_soak, OPS, IN_FLIGHT, timeout=600)
    harness.check_results(results)
