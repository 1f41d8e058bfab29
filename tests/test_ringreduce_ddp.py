"""ringreduce.DistributedDataParallel against torch's DDP.

Parity: the same model, data and seed trained for 20 steps under ringreduce's wrapper and under
torch's DDP, on the same process group (the backend under test), in the same ranks; parameters
must match within the tolerance per dtype (TOL in test_ddp) and be bit-identical across ranks
(the harness compares digests). The initial weights differ per rank: the wrapper must broadcast
rank 0's. Then: the bucket layout, overlap (recorded, not timed), unused parameters with and
without find_unused_parameters, mismatched models, state_dict interchange with torch's DDP.
"""

import pytest

import harness
from test_ddp import (MOVED, STEPS, TOL, _batch, _bf16_compress_hook, _build, _flat, _mismatch, _optimizer,
                      _train_steps)

# name -> options (as in test_ddp): "ddp" kwargs for both wrappers, "rr_ddp" for ringreduce's
# only, "hook" per wrapper. The no_overlap ones start the buckets when backward is done.
CONFIGS = {
    "default": {},
    "no_overlap": {"rr_ddp": {"overlap": False}},
    "no_overlap_find_unused": {"ddp": {"find_unused_parameters": True}, "rr_ddp": {"overlap": False},
                               "skip_every": 3},
    "no_overlap_bucket_view_no_sync": {"ddp": {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002},
                                       "rr_ddp": {"overlap": False}, "micro": 2, "min_buckets": 3},
    "small_buckets": {"ddp": {"bucket_cap_mb": 0.002}, "min_buckets": 3},
    "find_unused": {"ddp": {"find_unused_parameters": True}, "skip_every": 3},
    "static_graph": {"ddp": {"static_graph": True}, "optim": "adam"},
    "no_sync": {"micro": 2},
    "grad_as_bucket_view": {"ddp": {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002},
                            "min_buckets": 3},
    "grad_as_bucket_view_no_sync": {"ddp": {"gradient_as_bucket_view": True}, "micro": 3,
                                    "set_to_none": True},
    # zero_grad() as torch's default: one-parameter buckets adopt the new gradients
    "grad_as_bucket_view_set_to_none": {"ddp": {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002},
                                        "set_to_none": True, "min_buckets": 3},
    "batchnorm": {"batchnorm": True},
    "fp16_hook": {"hook": "fp16", "tol": "fp16_hook"},
    "bf16_hook": {"hook": "bf16", "tol": "bf16_hook"},
    "torch_fp16_hook": {"hook": "torch_fp16", "tol": "fp16_hook"},
    "powersgd": {"hook": "powersgd", "tol": "powersgd"},
    "float64": {"dtype": "float64", "tol": "float64"},
    "bfloat16": {"dtype": "bfloat16", "tol": "bfloat16"},
}


def _train(ctx, name, cfg, which, failures, tag):
    """Train under `which` ("ringreduce" or "torch") DDP on the default group; returns
    (rank 0's initial flat weights, final flat weights, the wrapper)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import ringreduce
    from ringreduce import comm_hooks

    dtype = cfg.get("dtype", "float32")
    bn = cfg.get("batchnorm", False)
    init0 = _flat(_build(ctx, name, 0, dtype, bn))
    model = _build(ctx, name, ctx.rank, dtype, bn)
    if which == "ringreduce":
        ddp = ringreduce.DistributedDataParallel(model, **cfg.get("ddp", {}), **cfg.get("rr_ddp", {}))
    else:
        ddp = TorchDDP(model, **cfg.get("ddp", {}))
    if not torch.equal(_flat(model), init0):
        failures.append(f"{tag}: after construction the weights are not rank 0's")
    hook = cfg.get("hook")
    if hook == "fp16":
        ddp.register_comm_hook(None, comm_hooks.fp16_compress_hook if which == "ringreduce"
                               else default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, comm_hooks.bf16_compress_hook if which == "ringreduce"
                               else _bf16_compress_hook)
    elif hook == "torch_fp16":  # torch's own hook on both wrappers
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    _train_steps(ctx, ddp, _optimizer(cfg, ddp), name, cfg, dtype, STEPS)
    if bn:
        ddp.eval()
        with torch.no_grad():
            ddp(_batch(ctx, name, STEPS, 0, ctx.rank, dtype)[0])
    return init0, _flat(model), ddp


def _rank_parity(ctx, name):
    cfg = CONFIGS[name]
    tol = TOL[cfg.get("tol", cfg.get("dtype", "float32"))]
    failures, digests = [], {}
    tag = f"ringreduce DDP {name} world={ctx.world_size} on {ctx.backend}"
    init0, ours, ddp = _train(ctx, name, cfg, "ringreduce", failures, tag)
    _, theirs, _ = _train(ctx, name, cfg, "torch", failures, f"torch DDP {name}")
    msg = _mismatch(ours, theirs, tol)
    if msg:
        failures.append(f"{tag}: vs torch's DDP: {msg}")
    if _mismatch(theirs, init0, MOVED) is None:
        failures.append(f"{tag}: training moved no weight by more than {MOVED}; the comparison is vacuous")
    buckets = len(ddp.bucket_assignment())
    if buckets < cfg.get("min_buckets", 1):
        failures.append(f"{tag}: {buckets} buckets, expected at least {cfg.get('min_buckets', 1)}")
    digests[f"{tag} final weights"] = harness.digest(ours)
    return failures, digests


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_with_torch_ddp(ranks, name):
    harness.check_results(ranks(2).run(_rank_parity, name, timeout=90))


@pytest.mark.parametrize("name", ["default", "find_unused", "fp16_hook"])
def test_parity_with_torch_ddp_world4(ranks, name):
    harness.check_results(ranks(4).run(_rank_parity, name, timeout=90))


def _rank_buckets_and_overlap(ctx):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import ringreduce

    failures = []
    torch.manual_seed(1)
    # A heavy first layer (its backward comes last) and light later ones: the light layers'
    # bucket is reduced while backward still works on the heavy one.
    model = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(),
                          nn.Linear(1024, 64), nn.Tanh(), nn.Linear(64, 8))
    ddp = ringreduce.DistributedDataParallel(model, bucket_cap_mb=2)
    names = ddp.bucket_assignment()
    # Reverse order, small first bucket (1 MiB) then up to 2 MiB.
    flat = [n for bucket in names for n in bucket]
    want_order = [n for n, _ in reversed(list(model.named_parameters()))]
    if flat != want_order:
        failures.append(f"bucket order {flat} is not reverse parameter order")
    sizes = [sum(dict(model.named_parameters())[n].numel() * 4 for n in b) for b in names]
    if any(s > 2 << 20 and len(b) > 1 for s, b in zip(sizes, names)) or len(names) < 3:
        failures.append(f"bucket sizes {sizes} for {names}")
    import copy

    reference = copy.deepcopy(model)  # rank 0's weights, after construction
    import os
    import time

    from ringreduce.ddp import _done

    def hold_backward(grad):
        # From step 1 on, the heavy first layer's gradients (the last ones backward produces) wait
        # until the first started bucket is reduced, without running it here: only the progress
        # thread can complete it, so this records that all-reduces run while backward does. How
        # soon it gets a core is up to the scheduler (a loaded CI machine once gave it none before
        # backward ended by itself), hence the wait, with a deadline, instead of a race.
        if holding and ddp._pending:
            deadline = time.monotonic() + 60
            while not all(_done(h) for h in ddp._pending[0][1]) and time.monotonic() < deadline:
                os.sched_yield()
        return grad

    holding = False
    for p in model[0].parameters():
        p.register_hook(hold_backward)
    completed = []
    for step in range(5):
        holding = step > 0
        x = torch.randn(256, 512, generator=ctx.gen("x", step, rank=ctx.rank))
        F.mse_loss(ddp(x), torch.zeros(256, 8)).backward()
        if step == 0:
            # The averaged gradients, those reduced in their bucket and those reduced in place
            # (a 1024x1024 weight fills a bucket alone): the gradient of the mean of every rank's loss, computed here in one process.
            xs = [torch.randn(256, 512, generator=ctx.gen("x", 0, rank=q)) for q in range(ctx.world_size)]
            (sum(F.mse_loss(reference(xq), torch.zeros(256, 8)) for xq in xs) / ctx.world_size).backward()
            for (n, p), q in zip(model.named_parameters(), reference.parameters()):
                if not torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7):
                    failures.append(f"{n}.grad differs from the single-process average "
                                    f"(max diff {(p.grad - q.grad).abs().max().item():.3g})")
        rec = ddp.overlap_record()
        # Started while backward still had gradients to produce: every step, by construction.
        if min(rec["ready_when_started"]) >= rec["params"]:
            failures.append(f"step {step}: no bucket started before the last gradient: {rec}")
        completed.append(rec["completed_before_last_gradient"])
    # And finished meanwhile: that needs the peer to have started it too, so it is asked of the
    # steps after the first (a backend may connect lazily), where backward holds for it.
    if ctx.backend == "ringreduce" and min(completed[1:]) < 1:
        failures.append(f"no all-reduce completed before the last gradient in steps 1-4: {completed}")
    return failures, {}


def test_bucket_layout_and_overlap(ranks):
    harness.check_results(ranks(2).run(_rank_buckets_and_overlap, timeout=90))


def _rank_no_overlap(ctx):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import ringreduce

    failures = []
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    ddp = ringreduce.DistributedDataParallel(model, bucket_cap_mb=0.1, overlap=False)
    if len(ddp.bucket_assignment()) < 3:
        failures.append(f"expected several buckets, got {ddp.bucket_assignment()}")
    for step in range(3):
        x = torch.randn(32, 64, generator=ctx.gen("x", step, rank=ctx.rank))
        F.mse_loss(ddp(x), torch.zeros(32, 8)).backward()
        rec = ddp.overlap_record()
        # Every bucket started once backward had produced the last gradient, all in order.
        if rec["overlap"] or rec["ready_when_started"] != [rec["params"]] * len(ddp.bucket_assignment()):
            failures.append(f"step {step}: with overlap=False a bucket started early: {rec}")
    return failures, {}


def test_no_overlap_starts_buckets_after_the_last_gradient(ranks):
    harness.check_results(ranks(2).run(_rank_no_overlap, timeout=90))


def _rank_large_and_in_place(ctx):
    """Gradients larger than the L3 cache (written back with streaming stores when they share a
    bucket), one-parameter buckets and large parameters sharing a bucket with small ones (on a
    ringreduce group the large ones are reduced in place in .grad and the small ones in the
    buffer; on gloo, which has no AVG, all of them are copied): each gradient averaged exactly as
    one process computes it."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    import ringreduce

    failures = []
    torch.manual_seed(2)
    # 33.6 MB and 4.9 MB weights; with a 64 MB cap both share a bucket with the first layer's bias
    base = nn.Sequential(nn.Linear(2048, 4100), nn.Tanh(), nn.Linear(4100, 300), nn.Tanh(),
                         nn.Linear(300, 8))
    names = [n for n, _ in base.named_parameters()]
    groups = {ctx.backend: dist.group.WORLD}
    if ctx.backend != "gloo":
        groups["gloo"] = dist.new_group(backend="gloo")
    xs = [torch.randn(16, 2048, generator=ctx.gen("x", q)) for q in range(ctx.world_size)]
    reference = copy.deepcopy(base)
    (sum(F.mse_loss(reference(x), torch.zeros(16, 8)) for x in xs) / ctx.world_size).backward()
    for label, group in groups.items():
        for cap in (25, 64):
            model = copy.deepcopy(base)
            ddp = ringreduce.DistributedDataParallel(model, process_group=group, bucket_cap_mb=cap)
            buckets = ddp._buckets
            averaging = dist.get_backend(group) == "ringreduce"
            assignment = ddp.bucket_assignment()
            shared = [b for b in assignment if len(b) > 1 and any(
                dict(model.named_parameters())[n].numel() * 4 >= 1 << 20 for n in b)]
            if cap == 64 and not shared:
                failures.append(f"{label}, cap {cap}: no large parameter shares a bucket: {assignment}")
            for step in range(2):  # .grad None, then accumulated into
                model.zero_grad(set_to_none=(step == 0))
                F.mse_loss(ddp(xs[ctx.rank]), torch.zeros(16, 8)).backward()
                tag = f"{label} group, bucket_cap_mb={cap}, step {step}"
                for (n, p), q in zip(model.named_parameters(), reference.parameters()):
                    if not torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7):
                        failures.append(f"{tag}: {n}.grad differs from the single-process average "
                                        f"(max diff {(p.grad - q.grad).abs().max().item():.3g})")
                for i, (n, p) in enumerate(model.named_parameters()):
                    # In step 0, .grad is the tensor AccumulateGrad handed over: in place too.
                    alone = len(buckets.params_of(buckets.bucket_of(i))) == 1
                    want = averaging and (alone or p.numel() * 4 >= 1 << 20)
                    if buckets.in_place(i) != want:
                        failures.append(f"{tag}: {n} (bucket {assignment[buckets.bucket_of(i)]}) "
                                        f"reduced {'in place' if buckets.in_place(i) else 'in its bucket'}")
                for b, members in enumerate(assignment):
                    # Each large one alone, the runs of small ones between them once each.
                    kinds = [buckets.solo(names.index(n)) for n in members]
                    want = 1 if not averaging else sum(kinds) + sum(
                        1 for k, small in enumerate(kinds) if not small and (k == 0 or kinds[k - 1]))
                    got = len(buckets.reduce_targets(b))
                    if got != want:
                        failures.append(f"{tag}: bucket {members} reduced by {got} all-reduces, "
                                        f"expected {want}")
            if cap == 64 and len(assignment) > 2:
                failures.append(f"{tag}: {assignment} should be two buckets at most")
    return failures, {}


def test_large_gradients_and_in_place_buckets(ranks):
    harness.check_results(ranks(2).run(_rank_large_and_in_place, timeout=120))


def _rank_views_after_set_to_none(ctx):
    """gradient_as_bucket_view with zero_grad(set_to_none=True), torch's default: each step the
    gradients are averaged and are the buckets' memory again; a one-parameter bucket adopts the
    gradient autograd handed over instead of copying it in, so a .grad kept from the step before
    keeps its values."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    import ringreduce

    failures = []
    torch.manual_seed(3)
    # With 256 KB buckets: the last layer and fc2's bias share one, and fc2's weight (614 KB),
    # fc1's bias and fc1's weight (524 KB) have one each.
    base = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 300), nn.Tanh(),
                         nn.Linear(300, 8))
    groups = {ctx.backend: dist.group.WORLD}
    if ctx.backend != "gloo":
        groups["gloo"] = dist.new_group(backend="gloo")  # no AVG: gradients scaled on the way in
    for label, group in groups.items():
        model = copy.deepcopy(base)
        ddp = ringreduce.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.25,
                                                 gradient_as_bucket_view=True)
        buckets = ddp._buckets
        params = list(model.named_parameters())
        alone = [len(buckets.params_of(buckets.bucket_of(i))) == 1 for i in range(len(params))]
        if sum(alone) != 3 or all(alone):
            failures.append(f"{label}: expected 3 one-parameter buckets and a shared one: "
                            f"{ddp.bucket_assignment()}")
        kept = None
        for step in range(3):
            model.zero_grad(set_to_none=True)
            xs = [torch.randn(32, 256, generator=ctx.gen("x", label, step, rank=q))
                  for q in range(ctx.world_size)]
            F.mse_loss(ddp(xs[ctx.rank]), torch.zeros(32, 8)).backward()
            reference = copy.deepcopy(base)
            (sum(F.mse_loss(reference(x), torch.zeros(32, 8)) for x in xs) / ctx.world_size).backward()
            tag = f"{label} group, step {step}"
            for i, ((n, p), q) in enumerate(zip(params, reference.parameters())):
                if not torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7):
                    failures.append(f"{tag}: {n}.grad differs from the single-process average "
                                    f"(max diff {(p.grad - q.grad).abs().max().item():.3g})")
                buf = buckets.buffer(buckets.bucket_of(i))
                lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
                if not (lo <= p.grad.data_ptr() < hi) or p.grad.data_ptr() != buckets.view(i).data_ptr():
                    failures.append(f"{tag}: {n}.grad is not its view of bucket {buckets.bucket_of(i)}")
            if kept is not None:
                for i, (n, _) in enumerate(params):
                    tensor, values = kept[i]
                    if alone[i] and not torch.equal(tensor, values):
                        failures.append(f"{tag}: the {n}.grad kept from step {step - 1} was overwritten")
            kept = [(p.grad, p.grad.clone()) for _, p in params]
    return failures, {}


def test_bucket_views_after_zero_grad_set_to_none(ranks):
    harness.check_results(ranks(2).run(_rank_views_after_set_to_none, timeout=90))


def _rank_unused_and_errors(ctx):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import ringreduce

    failures = []

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 8)
            self.head_a = nn.Linear(8, 2)
            self.head_b = nn.Linear(8, 2)
            self.never = nn.Linear(8, 2)

        def forward(self, x, head):
            h = self.body(x)
            return self.head_a(h) if head == "a" else self.head_b(h)

    torch.manual_seed(0)
    # Without find_unused_parameters: a clear error naming what got no gradient, on every rank.
    ddp = ringreduce.DistributedDataParallel(TwoHeads())
    try:
        F.mse_loss(ddp(torch.randn(4, 8), "a"), torch.zeros(4, 2)).backward()
        failures.append("backward with unused parameters and find_unused_parameters=False did not fail")
    except RuntimeError as e:
        for name in ("head_b.weight", "never.weight", "find_unused_parameters"):
            if name not in str(e):
                failures.append(f"unused-parameter error does not name {name}: {e}")
    # The group is still usable and in step afterwards.
    t = torch.ones(3)
    torch.distributed.all_reduce(t)
    if not torch.equal(t, torch.full((3,), float(ctx.world_size))):
        failures.append("all_reduce after the unused-parameter error is wrong")

    # With it: ranks use different heads; a head used on one rank gets that rank's gradient
    # averaged; the layer no rank uses keeps grad None.
    model = TwoHeads()
    ddp = ringreduce.DistributedDataParallel(model, find_unused_parameters=True)
    ref = TwoHeads()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(4, 8, generator=ctx.gen("u", rank=q)) for q in range(ctx.world_size)]
    head = "a" if ctx.rank == 0 else "b"
    F.mse_loss(ddp(xs[ctx.rank], head), torch.zeros(4, 2), reduction="sum").backward()
    # The reference: every rank's loss in one process, divided by the world size.
    loss = sum(F.mse_loss(ref(xs[q], "a" if q == 0 else "b"), torch.zeros(4, 2), reduction="sum")
               for q in range(ctx.world_size)) / ctx.world_size
    loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if (p.grad is None) != (q.grad is None):
            failures.append(f"find_unused: {n}.grad is {p.grad is None and 'None' or 'set'}, "
                            f"reference {q.grad is None and 'None' or 'set'}")
        elif p.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
            failures.append(f"find_unused: {n}.grad differs from the single-process reference")

    # Models that differ across ranks fail at construction, naming the first difference.
    width = 8 if ctx.rank == 0 else 9
    try:
        ringreduce.DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, width)))
        failures.append("mismatched models did not fail at construction")
    except RuntimeError as e:
        if "1.weight" not in str(e) or "rank 0" not in str(e):
            failures.append(f"mismatch error does not name the parameter and rank 0: {e}")
    return failures, {}


def test_unused_parameters_and_errors(ranks):
    harness.check_results(ranks(2).run(_rank_unused_and_errors, timeout=90))


def _rank_state_dict(ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import ringreduce

    failures = []
    ours = ringreduce.DistributedDataParallel(_build(ctx, "sd", ctx.rank, "float32"))
    theirs = TorchDDP(_build(ctx, "sd2", ctx.rank, "float32"))
    if list(ours.state_dict()) != list(theirs.state_dict()):
        failures.append(f"state_dict keys {list(ours.state_dict())} != torch's {list(theirs.state_dict())}")
    theirs.load_state_dict(ours.state_dict())
    ours2 = ringreduce.DistributedDataParallel(_build(ctx, "sd3", ctx.rank, "float32"))
    ours2.load_state_dict(theirs.state_dict())
    if not torch.equal(_flat(ours2.module), _flat(ours.module)):
        failures.append("a checkpoint did not survive ringreduce -> torch -> ringreduce")
    return failures, {}


def test_state_dict_moves_between_wrappers(ranks):
    harness.check_results(ranks(2).run(_rank_state_dict, timeout=60))
