"""Drop-in checks with torch's own data-parallel machinery on ringreduce:
DistributedDataParallel in every configuration a training script uses, FSDP2 (fully_shard)
on CPU, and the save-on-rank-0 / load-everywhere checkpoint pattern.

Every training runs twice inside the same ranks, on the backend under test (the default
group) and on gloo (``ctx.gloo``), from the same initial weights and the same per-rank
data; the parameters afterwards must match within the tolerance stated in TOL and be
bit-identical across ranks.  The initial weights differ per rank on purpose: DDP must
broadcast rank 0's at construction, which is checked bit for bit.
"""

import pytest

import harness

STEPS = 20
BATCH = 16
D_IN, D_HID, D_OUT = 32, 96, 8  # fc1 32x96, fc2 96x96, fc3 96x8: 13,256 parameters

# Tolerances, relative, element-wise: |got - gloo| <= rtol * (|gloo| + rms(gloo)).
# Same model, data and math on both backends, so the only differences come from the order
# of the cross-rank sums (ring vs gloo's algorithm), amplified by 20 optimizer steps.  On 2
# ranks (a + b either way) the runs come out bit-identical; the bounds are for 4 ranks,
# where the largest differences seen over several seeds were float32 1.6e-6 (Adam),
# float64 3e-16, bf16 parameters 1.9e-2, fp16 hook 2.6e-4, bf16 hook 2.2e-3.
TOL = {
    "float32": 1e-5,
    "float64": 1e-12,
    "bfloat16": 5e-2,  # bf16 parameters and gradients (one bf16 ulp is 2^-8 = 3.9e-3)
    "fp16_hook": 1e-3,  # fp32 parameters, gradients reduced in fp16 (both runs use the hook)
    "bf16_hook": 1e-2,  # ... reduced in bf16
    "powersgd": 1e-4,  # fp32, rank-1 PowerSGD (both runs use the hook, same seed)
}

# Training must move some weight by more than this (relative, as above), so that every
# tolerance is small next to what training does and matching gloo means something.
MOVED = 0.1

# name -> options; every config trains fp32 SGD with momentum unless it says otherwise.
DDP_CONFIGS = {
    "default": {},
    "small_buckets": {"ddp": {"bucket_cap_mb": 0.002}, "min_buckets": 3},  # 3 buckets after the rebuild
    "find_unused": {"ddp": {"find_unused_parameters": True}, "skip_every": 3},
    "static_graph": {"ddp": {"static_graph": True}, "optim": "adam"},
    "no_sync": {"micro": 2},
    "grad_as_bucket_view": {"ddp": {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002},
                            "min_buckets": 3},
    "fp16_hook": {"hook": "fp16", "tol": "fp16_hook"},
    "bf16_hook": {"hook": "bf16", "tol": "bf16_hook"},
    "powersgd": {"hook": "powersgd", "tol": "powersgd"},
    "join_uneven": {"join": True},
    "batchnorm": {"batchnorm": True},
    "float64": {"dtype": "float64", "tol": "float64"},
    "bfloat16": {"dtype": "bfloat16", "tol": "bfloat16"},
}

_MLP = []


def _mlp_class():
    """The model (defined lazily so that the pytest process need not import torch early)."""
    if _MLP:
        return _MLP[0]
    import torch
    import torch.nn as nn

    class MLP(nn.Module):
        def __init__(self, batchnorm=False):
            super().__init__()
            self.fc1 = nn.Linear(D_IN, D_HID)
            self.bn = nn.BatchNorm1d(D_HID) if batchnorm else None
            self.fc2 = nn.Linear(D_HID, D_HID)
            self.fc3 = nn.Linear(D_HID, D_OUT)

        def forward(self, x, skip=False):
            h = self.fc1(x)
            if self.bn is not None:
                h = self.bn(h)
            h = torch.tanh(h)
            if not skip:  # fc2 gets no gradient on the steps that skip it
                h = torch.tanh(self.fc2(h))
            return self.fc3(h)

    _MLP.append(MLP)
    return MLP


def _build(ctx, key, rank, dtype, batchnorm=False):
    """The model as rank ``rank`` builds it (any rank can rebuild any other's)."""
    import torch

    torch.manual_seed(harness.mix_seed(ctx.seed, "init", key, rank))
    return _mlp_class()(batchnorm=batchnorm).to(getattr(torch, dtype))


def _flat(module):
    """Parameters then floating-point buffers, flattened into one fresh tensor (in their dtype)."""
    import torch

    ts = [p.detach().reshape(-1) for p in module.parameters()]
    ts += [b.detach().reshape(-1).to(ts[0].dtype) for b in module.buffers() if b.is_floating_point()]
    return torch.cat(ts).clone()


def _mismatch(got, ref, rtol):
    """None if ``got`` is within rtol of ``ref`` (see TOL), else a description."""
    import torch

    g, r = got.to(torch.float64), ref.to(torch.float64)
    if g.shape != r.shape:
        return f"shape {tuple(g.shape)} != {tuple(r.shape)}"
    allowed = rtol * (r.abs() + r.pow(2).mean().sqrt())
    err = (g - r).abs()
    bad = ~(err <= allowed)  # NaN counts as bad
    if not bool(bad.any()):
        return None
    i = int(torch.nan_to_num(err / allowed, nan=float("inf")).argmax())
    return (f"{int(bad.sum())}/{g.numel()} elements outside rtol {rtol:g}; worst at {i}: "
            f"got {g[i].item()!r}, gloo {r[i].item()!r} (|err| {err[i].item():.3g}, "
            f"allowed {allowed[i].item():.3g})")


def _batch(ctx, name, step, micro, rank, dtype):
    import torch

    g = ctx.gen("data", name, step, micro, rank=rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = torch.randn(BATCH, D_OUT, generator=g)
    return x.to(getattr(torch, dtype)), y.to(getattr(torch, dtype))


def _bf16_compress_hook(process_group, bucket):
    """torch's ``default_hooks.bf16_compress_hook``, body for body.  DDP refuses that function by
    its name unless torch was built with CUDA and NCCL >= 2.10 (whatever the backend: gloo too),
    so CPU torch reaches the same code through this alias."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def _optimizer(cfg, ddp):
    import torch

    if cfg.get("optim") == "adam":
        return torch.optim.Adam(ddp.parameters(), lr=1e-2)
    return torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


def _train_steps(ctx, ddp, opt, name, cfg, dtype, steps):
    """The loop every DDP configuration trains with: `micro` micro-batches per step, all but
    the last under no_sync(); with `skip_every`, fc2 unused on some steps."""
    import contextlib

    import torch.nn.functional as F

    micro = cfg.get("micro", 1)
    skip_every = cfg.get("skip_every")
    for step in range(steps):
        for m in range(micro):
            sync = contextlib.nullcontext() if m == micro - 1 else ddp.no_sync()
            with sync:
                x, y = _batch(ctx, name, step, m, ctx.rank, dtype)
                skip = skip_every is not None and step % skip_every == 1
                out = ddp(x, skip=skip) if skip_every else ddp(x)
                F.mse_loss(out, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=cfg.get("set_to_none", False))


def _train_ddp(ctx, name, cfg, pg, failures, tag):
    """Train one configuration under DDP on process group ``pg``; returns
    (rank 0's initial flat weights, final flat weights and buffers, number of buckets)."""
    import contextlib

    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    dtype = cfg.get("dtype", "float32")
    bn = cfg.get("batchnorm", False)
    init0 = _flat(_build(ctx, name, 0, dtype, bn))
    model = _build(ctx, name, ctx.rank, dtype, bn)  # differs per rank: DDP broadcasts rank 0's
    ddp = DDP(model, process_group=pg, **cfg.get("ddp", {}))
    if not torch.equal(_flat(model), init0):
        failures.append(f"{tag}: after construction the weights are not rank 0's")
    hook = cfg.get("hook")
    if hook == "fp16":
        ddp.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(pg, _bf16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = _optimizer(cfg, ddp)
    # Join: rank r has 4*r fewer batches than rank 0.
    steps = STEPS - 4 * ctx.rank if cfg.get("join") else STEPS
    join = Join([ddp]) if cfg.get("join") else contextlib.nullcontext()
    with join:
        _train_steps(ctx, ddp, opt, name, cfg, dtype, steps)
    if bn:
        # Training forwards leave each rank with its own running stats (DDP broadcasts rank 0's
        # buffers *before* each forward); one more forward, in eval mode, syncs them.
        ddp.eval()
        with torch.no_grad():
            ddp(_batch(ctx, name, steps, 0, ctx.rank, dtype)[0])
    buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    return init0, _flat(model), buckets


def _rank_ddp(ctx, name):
    import torch.distributed as dist

    cfg = DDP_CONFIGS[name]
    tol = TOL[cfg.get("tol", cfg.get("dtype", "float32"))]
    failures, digests = [], {}
    tag = f"DDP {name} world={ctx.world_size}"
    init0, mine, buckets = _train_ddp(ctx, name, cfg, dist.group.WORLD, failures, f"{tag} {ctx.backend}")
    _, ref, gloo_buckets = _train_ddp(ctx, name, cfg, ctx.gloo, failures, f"{tag} gloo")
    msg = _mismatch(mine, ref, tol)
    if msg:
        failures.append(f"{tag}: {ctx.backend} vs gloo: {msg}")
    # The comparison means something only if training moved the weights well past the tolerance.
    if _mismatch(ref, init0, MOVED) is None:
        failures.append(f"{tag}: gloo training moved no weight by more than {MOVED} (relative); "
                        "the comparison is vacuous")
    if buckets < cfg.get("min_buckets", 1) or buckets != gloo_buckets:
        failures.append(f"{tag}: {buckets} buckets ({gloo_buckets} on gloo), expected at least "
                        f"{cfg.get('min_buckets', 1)}")
    digests[f"{tag} {ctx.backend} final weights"] = harness.digest(mine)
    digests[f"{tag} gloo final weights"] = harness.digest(ref)
    return failures, digests


@pytest.mark.parametrize("name", list(DDP_CONFIGS))
def test_ddp_matches_gloo(ranks, name):
    harness.check_results(ranks(2).run(_rank_ddp, name, timeout=60))


@pytest.mark.parametrize("name", ["default", "small_buckets", "join_uneven", "bf16_hook"])
def test_ddp_matches_gloo_world4(ranks, name):
    harness.check_results(ranks(4).run(_rank_ddp, name, timeout=60))


# --------------------------------------------------------------------------------------
# FSDP2


def _fsdp_model(ctx):
    import torch
    import torch.nn as nn

    torch.manual_seed(harness.mix_seed(ctx.seed, "fsdp-init"))
    # Odd sizes so that shards are uneven (padding) on 2 and 4 ranks.
    return nn.Sequential(nn.Linear(D_IN, 97), nn.Tanh(), nn.Linear(97, 61), nn.Tanh(), nn.Linear(61, D_OUT))


def _train_fsdp(ctx, pg, steps):
    """FSDP2 training on ``pg``: each Linear its own FSDP unit, the root one more.
    Returns (this rank's losses, the sharded model)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(pg, "cpu")
    model = _fsdp_model(ctx)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = _batch(ctx, "fsdp", step, 0, ctx.rank, "float32")
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), model


def _gather_shards(ctx, model):
    """The full weights of an FSDP2 model, gathered over gloo (the oracle) from the local
    shards (uneven: FSDP2 shards dim 0 like torch.chunk)."""
    import torch
    import torch.distributed as dist

    full = []
    for p in model.parameters():
        shards = [None] * ctx.world_size
        dist.all_gather_object(shards, p.to_local().detach(), group=ctx.gloo)
        t = torch.cat(shards)
        assert tuple(t.shape) == tuple(p.shape), (tuple(t.shape), tuple(p.shape))
        full.append(t.reshape(-1))
    return torch.cat(full)


def _reference_fsdp(ctx, steps):
    """The same training in one process on every rank's data at once (mean of the ranks'
    mean losses = the full-batch mean loss, as the batches are the same size)."""
    import torch
    import torch.nn.functional as F

    model = _fsdp_model(ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        batches = [_batch(ctx, "fsdp", step, 0, q, "float32") for q in range(ctx.world_size)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_fsdp(ctx, steps):
    import torch
    import torch.distributed as dist

    failures, digests = [], {}
    tag = f"FSDP2 world={ctx.world_size}"
    tol = TOL["float32"]
    losses, model = _train_fsdp(ctx, dist.group.WORLD, steps)
    full = _gather_shards(ctx, model)
    g_losses, g_model = _train_fsdp(ctx, ctx.gloo, steps)
    g_full = _gather_shards(ctx, g_model)
    ref = _reference_fsdp(ctx, steps)
    for what, got, want in (("losses vs gloo", losses, g_losses), ("weights vs gloo", full, g_full),
                            ("weights vs single-process full batch", full, ref)):
        msg = _mismatch(got, want, tol)
        if msg:
            failures.append(f"{tag} {ctx.backend}: {what}: {msg}")
    if _mismatch(ref, _flat(_fsdp_model(ctx)), MOVED) is None:
        failures.append(f"{tag}: training moved no weight by more than {MOVED} (relative); "
                        "the comparison is vacuous")
    # Each rank holds only its shards, so the cross-rank check is the gathered weights
    # (gathered over gloo, so equal across ranks whenever the shards are right).
    digests[f"{tag} {ctx.backend} final weights"] = harness.digest(full)
    return failures, digests


def _rank_fsdp_full_tensor(ctx):
    """DTensor.full_tensor() on FSDP2 weights (what users call to save or inspect them), on
    the group under test: exactly the weights that were sharded, on every rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    failures, digests = [], {}
    tag = f"FSDP2 full_tensor() world={ctx.world_size} {ctx.backend}"
    model = _fsdp_model(ctx)
    want = _flat(model)
    fully_shard(model, mesh=DeviceMesh.from_group(dist.group.WORLD, "cpu"))
    try:
        got = torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])
    except Exception as e:  # noqa: BLE001 - reported as a failure (raised alike on every rank)
        failures.append(f"{tag}: raised {type(e).__name__}: {str(e).splitlines()[0]}")
    else:
        if not torch.equal(got, want):
            failures.append(f"{tag}: differs from the weights that were sharded")
        digests[tag] = harness.digest(got)
    return failures, digests


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_matches_gloo(ranks, world):
    harness.check_results(ranks(world).run(_rank_fsdp, 5, timeout=60))


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_full_tensor(ranks, world):
    harness.check_results(ranks(world).run(_rank_fsdp_full_tensor, timeout=60))


# --------------------------------------------------------------------------------------
# checkpoint: rank 0 saves, every rank loads


def _ckpt_train(ctx, ddp, opt, first, count):
    import torch.nn.functional as F

    for step in range(first, first + count):
        x, y = _batch(ctx, "ckpt", step, 0, ctx.rank, "float32")
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()


def _rank_checkpoint(ctx, path, before, after):
    import torch
    import torch.distributed as dist
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
    from torch.nn.parallel import DistributedDataParallel as DDP

    failures, digests = [], {}
    tag = f"checkpoint world={ctx.world_size}"

    def fresh(key):
        model = _build(ctx, key, ctx.rank, "float32")
        ddp = DDP(model)
        return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    # The uninterrupted run, for reference.
    model, ddp, opt = fresh("ckpt")
    _ckpt_train(ctx, ddp, opt, 0, before + after)
    uninterrupted = _flat(model)

    model, ddp, opt = fresh("ckpt")
    _ckpt_train(ctx, ddp, opt, 0, before)
    saved = _flat(model)
    if ctx.rank == 0:
        torch.save({"model": ddp.state_dict(), "optim": opt.state_dict()}, path)
    dist.barrier()
    del model, ddp, opt

    # A fresh model with other weights (per rank) loads the checkpoint before DDP sees it.
    model = _build(ctx, "ckpt-fresh", ctx.rank, "float32")
    ckpt = torch.load(path, map_location="cpu")
    state = ckpt["model"]
    consume_prefix_in_state_dict_if_present(state, "module.")
    model.load_state_dict(state)
    if not torch.equal(_flat(model), saved):
        failures.append(f"{tag}: the loaded weights differ from the ones rank 0 saved")
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    opt.load_state_dict(ckpt["optim"])
    _ckpt_train(ctx, ddp, opt, before, after)
    resumed = _flat(model)
    # Same backend, same buckets, same data: resuming is the uninterrupted run; allow float32
    # rounding only (DDP may lay out its buckets differently in the first iteration).
    msg = _mismatch(resumed, uninterrupted, TOL["float32"])
    if msg:
        failures.append(f"{tag}: resumed run vs uninterrupted run: {msg}")
    if torch.equal(resumed, saved):
        failures.append(f"{tag}: training after loading did not change the weights")
    digests[f"{tag} loaded weights"] = harness.digest(saved)
    digests[f"{tag} resumed weights"] = harness.digest(resumed)
    dist.barrier()  # nobody still reads the file when the test removes it
    return failures, digests


def test_checkpoint_save_rank0_load_everywhere(ranks, tmp_path):
    path = str(tmp_path / "ddp.pt")
    harness.check_results(ranks(2).run(_rank_checkpoint, path, 5, 3, timeout=60))
