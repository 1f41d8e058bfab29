"""Tensor-parallel decode, end to end: a Llama-shaped decoder split over the ranks of one host,
greedy decoding with torch's own tensor parallelism and with a hand-split Megatron-style model,
its all-reduces on ringreduce, on gloo and on DeepSpeed's shared-memory all-reduce, in one run.

    python benchmarks/tp_decode.py                       # 2 ranks, hidden 1024, 8 layers, prompt 128, 64 tokens
    python benchmarks/tp_decode.py --setups dtensor-gloo,dtensor-rr,split-direct,split-none
    python benchmarks/tp_decode.py --hidden 64 --layers 2 --heads 4 --mlp 128 --vocab 256 --prompt 8 --tokens 4

The model (tp_model.py) is built on every rank from the same seed (random weights, no download):
token embedding, --layers pre-norm blocks (RMSNorm; attention with rotary embeddings and a
preallocated KV cache; a SwiGLU MLP, gate/up/down), a final RMSNorm and an LM head. Every rank
builds the whole model and then keeps its shards: q/k/v, gate and up split by output
(column-parallel), o and down by input (row-parallel), so each block needs two all-reduces per
token, after attention-out and after MLP-down; the embedding and the LM head stay whole on every
rank. Batch 1: one prefill of the --prompt tokens (which gives the first new token), then
--tokens - 1 decode steps of one token each, each next token the argmax of the last logits (greedy).

The setups (--setups takes a comma list of these keys; default all):

  dtensor-gloo           torch.distributed.tensor.parallel.parallelize_module (ColwiseParallel for
                         q/k/v, gate, up; RowwiseParallel for o, down) on a DeviceMesh over a gloo
                         group, eager. Its tokens are the reference the others are compared with.
  dtensor-rr             the same on the ringreduce group
  dtensor-gloo-compiled  dtensor-gloo under torch.compile (--compile-backend, default aot_eager)
  dtensor-rr-compiled    dtensor-rr under torch.compile
  dtensor-none           the same DTensor model on torch's fake process group, whose collectives do
                         nothing: the floor of the DTensor rows, what DTensor and compute alone take
                         (its tokens differ, as they must)
  dtensor-none-compiled  dtensor-none under torch.compile
  split-gloo             the hand-split model, each all-reduce dist.all_reduce on the gloo group
  split-rr               the same, dist.all_reduce on the ringreduce group
  split-direct           the same, ringreduce's direct op ringreduce.all_reduce_(t, op="sum")
  split-deepspeed        the same, deepspeed.comm.inference_all_reduce(t) (DS_ACCELERATOR=cpu, in the
                         python of .venv-peers, in a launch of its own; that launch also times
                         split-none, so that the two launches' machines can be compared, and
                         split-direct on a ringreduce group of its own (split-direct@ds), the row
                         that DeepSpeed's is compared with)
  split-none             the same with no communication: the all-reduce replaced by nothing, the
                         floor that compute alone sets (its tokens differ, as they must)

How it is measured:
- Every setup but DeepSpeed's runs in the same two processes, one launch; every setup is warmed up
  (a prefill and two decode steps: that is when torch.compile compiles), then --rounds rounds, the
  order rotated each round, each round a whole generation per setup, with a barrier (on a gloo group
  of its own) before each.
- time per token = the median over every decode step of every round, on each rank; the slowest
  rank's median is reported. tokens/s = 1000 / that (batch 1). prefill = the same for the prefill
  (one per round). warm-up = the first generation's time, compilation included.
- tokens: the generated ids of the last round, compared with dtensor-gloo's; ranks are checked to
  agree with one another (a split model's ranks compute the same logits).
- each warm-up is checked on the ringreduce group's op count: a setup on ringreduce runs two
  all-reduces per layer and forward there, any other none (a setup that does not is an error row).
- One intra-op thread per rank (--threads), since the development machine gives each of two ranks
  one core.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.abspath(__file__)
DEFAULT_PEERS_PYTHON = os.path.join(REPO, ".venv-peers", "bin", "python")
WARMUP_TOKENS = 3  # a prefill and two decode steps: enough for torch.compile to compile both graphs

# benchmarks/ is no package: peers.py's launch helpers and DeepSpeed check, shared rather than copied,
# from its modules that import no ringreduce (this file's DeepSpeed ranks run in .venv-peers).
sys.path.insert(0, HERE)
import peers_cpu  # noqa: E402
import peers_launch  # noqa: E402
import peers_native  # noqa: E402
import peers_ranks  # noqa: E402
from tp_model import SEED, build, full_weights, generate, parallelize  # noqa: E402


@dataclass(frozen=True)
class Setup:
    key: str
    label: str
    form: str  # "dtensor" or "split"
    comm: str  # "gloo", "ringreduce", "direct", "deepspeed" or "none"
    compiled: bool = False


SETUPS = [
    Setup("dtensor-gloo", "DTensor, gloo, eager", "dtensor", "gloo"),
    Setup("dtensor-rr", "DTensor, ringreduce, eager", "dtensor", "ringreduce"),
    Setup("dtensor-gloo-compiled", "DTensor, gloo, compiled", "dtensor", "gloo", compiled=True),
    Setup("dtensor-rr-compiled", "DTensor, ringreduce, compiled", "dtensor", "ringreduce", compiled=True),
    Setup("dtensor-none", "DTensor, no communication (floor)", "dtensor", "none"),
    Setup("dtensor-none-compiled", "DTensor, no communication, compiled", "dtensor", "none", compiled=True),
    Setup("split-gloo", "hand-split, dist.all_reduce on gloo", "split", "gloo"),
    Setup("split-rr", "hand-split, dist.all_reduce on ringreduce", "split", "ringreduce"),
    Setup("split-direct", "hand-split, ringreduce.all_reduce_ (direct op)", "split", "direct"),
    Setup("split-deepspeed", "hand-split, DeepSpeed inference_all_reduce", "split", "deepspeed"),
    Setup("split-none", "hand-split, no communication (floor)", "split", "none"),
]
BY_KEY = {s.key: s for s in SETUPS}
REFERENCE = "dtensor-gloo"
# The floor timed again inside DeepSpeed's launch, to show how that launch's machine compared.
DS_FLOOR = "split-none@ds"
# ringreduce's direct op timed again inside DeepSpeed's launch, in the same processes as DeepSpeed's
# op (this repository's package, on the peers' python, whose torch is the same version as .venv's):
# the comparison with DeepSpeed that no difference between launches enters.
DS_DIRECT = "split-direct@ds"


# ---------------------------------------------------------------------------------------------------
# Inside the ranks


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _fake_group():
    """A group of every rank on torch's fake process group ("fake"), whose collectives return at
    once without moving anything."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    return dist.new_group(backend="fake")


def _main_setups(cfg, rank, world):
    """{key: (model, reason it cannot run or None)} for the setups of the main launch."""
    import torch.distributed as dist

    import ringreduce

    rr = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    sd = full_weights(cfg)
    shared = {k: nn.Parameter(sd[k], requires_grad=False) for k in ("embed.weight", "lm_head.weight")}
    wanted = set(cfg.setups)
    models: dict = {}
    dtensor: dict = {}
    groups = [gloo]
    for comm in ("gloo", "ringreduce", "none"):
        keys = [s.key for s in SETUPS if s.form == "dtensor" and s.comm == comm and s.key in wanted]
        if keys:
            group = {"gloo": gloo, "ringreduce": rr}.get(comm)
            if comm == "none":
                try:
                    group = _fake_group()
                except Exception as e:  # noqa: BLE001  (a row that says why, not a crashed run)
                    dtensor[comm] = (None, f"torch's fake process group is not available: {_first_line(e)}")
                    continue
                groups.append(group)
            try:
                dtensor[comm] = (parallelize(build(cfg, sd, "dtensor", rank, world, shared), group, comm), None)
            except Exception as e:  # noqa: BLE001  (a row that says why, not a crashed run)
                dtensor[comm] = (None, f"parallelize_module failed: {_first_line(e)}")
    split_keys = [s.key for s in SETUPS if s.form == "split" and s.key in wanted]
    split = build(cfg, sd, "split", rank, world, shared) if split_keys else None
    del sd

    for s in SETUPS:
        if s.key not in wanted or s.comm == "deepspeed":
            continue
        if s.form == "dtensor":
            model, reason = dtensor[s.comm]
            if model is not None and s.compiled:
                try:
                    model = torch.compile(model, backend=cfg.compile_backend, dynamic=False)
                except Exception as e:  # noqa: BLE001  (an unknown backend fails here, not at the call)
                    model, reason = None, f"compile failed: {_first_line(e)}"
            models[s.key] = (model, reason)
        elif s.comm == "direct":
            if hasattr(ringreduce, "all_reduce_"):
                models[s.key] = (split, lambda t: ringreduce.all_reduce_(t, op="sum", group=None))
            else:
                models[s.key] = (None, "not available in this build")
        else:
            fn = {"gloo": lambda t: dist.all_reduce(t, group=gloo),
                  "ringreduce": lambda t: dist.all_reduce(t, group=rr),
                  "none": None}[s.comm]
            models[s.key] = (split, fn)
    # How many ops the ringreduce group has run, for the check that each setup communicates where it says.
    rr_ops = rr._get_backend(torch.device("cpu"))._get_sequence_number_for_group
    return models, groups, rr_ops


def _run_setups(cfg, rank, world, control, models: dict, rr_ops=None) -> dict:
    """Warm up and time every runnable setup; return {key: this rank's record}.

    models[key] is (model, reduce) for a hand-split setup, whose all-reduce is set before each of its
    generations, and (model, reason) for a DTensor one, where a string says why it cannot run.
    rr_ops() counts the ringreduce group's ops: each warm-up is checked to have communicated there
    exactly when its setup says it does (_wrong_group)."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(SEED + 1)
    prompt = torch.randint(0, cfg.vocab, (1, cfg.prompt), generator=g)
    records: dict = {}
    split_form = {k for k in models if BY_KEY[k.split("@")[0]].form == "split"}

    def run(key, tokens):
        model, extra = models[key]
        if key in split_form:
            model.set_reduce(extra)
        # no_grad, not inference_mode: DTensor's eager path runs about 3x slower under inference_mode
        # (torch 2.13, measured at the toy size), which would be a cost of this script, not of TP.
        with torch.no_grad():
            return generate(model, prompt, tokens)

    runnable = []
    for key, (model, extra) in models.items():
        problem = extra if model is None else None
        start = time.perf_counter()
        if problem is None:
            dist.barrier(group=control)
            before = rr_ops() if rr_ops else 0
            try:
                run(key, min(WARMUP_TOKENS, cfg.tokens))
            except Exception as e:  # noqa: BLE001
                problem = (f"{'compile' if BY_KEY[key.split('@')[0]].compiled else 'warm-up'} failed: "
                           f"{_first_line(e)}")
            if problem is None and rr_ops:
                problem = _wrong_group(key, rr_ops() - before, cfg)
        warm = time.perf_counter() - start
        # Every rank must agree on what runs: one that failed would leave its peer waiting.
        problems: list = [None] * world
        dist.all_gather_object(problems, problem, group=control)
        reason = next((p for p in problems if p), None)
        records[key] = {"warmup_s": warm, "error": reason, "steps": [], "prefill": [], "tokens": None}
        if reason is None:
            runnable.append(key)
    for r in range(cfg.rounds):
        order = runnable[r % len(runnable):] + runnable[: r % len(runnable)] if runnable else []
        for key in order:
            dist.barrier(group=control)
            prefill, steps, tokens = run(key, cfg.tokens)
            rec = records[key]
            rec["prefill"].append(prefill)
            rec["steps"] += steps
            rec["tokens"] = tokens
    return records


def _direct_beside_deepspeed(split, world: int, control):
    """(model, reduce or reason), the op counter and the group of ringreduce's direct op in
    DeepSpeed's launch: this repository's ringreduce imported into the peers' python. Every rank
    must load it before any creates its group, or the others would wait in new_group."""
    import torch.distributed as dist

    problem = None
    try:
        if REPO not in sys.path:
            sys.path.insert(0, REPO)
        import ringreduce

        ringreduce.load_extension()  # here, not in new_group below, where a failure would end the launch
        if not hasattr(ringreduce, "all_reduce_"):
            problem = "this ringreduce has no direct op"
    except Exception as e:  # noqa: BLE001  (a row that says why, not a crashed run)
        problem = f"ringreduce does not load in {sys.executable}: {_first_line(e)}"
    problems: list = [None] * world
    dist.all_gather_object(problems, problem, group=control)
    reason = next((p for p in problems if p), None)
    if reason:
        return (None, reason), None, None
    group = dist.new_group(backend="ringreduce")
    ops = group._get_backend(torch.device("cpu"))._get_sequence_number_for_group
    return (split, lambda t: ringreduce.all_reduce_(t, op="sum", group=group)), ops, group


def _wrong_group(key: str, rr_ops: int, cfg) -> str | None:
    """Why a setup's warm-up shows it did not communicate where it says (None when it did): one on
    ringreduce issues two all-reduces per layer and forward on the ringreduce group, any other
    none there."""
    forwards = min(WARMUP_TOKENS, cfg.tokens)
    on_rr = BY_KEY[key.split("@")[0]].comm in ("ringreduce", "direct")
    if on_rr and rr_ops < 2 * cfg.layers * forwards:
        return (f"its all-reduces did not run on ringreduce: {rr_ops} ops on the ringreduce group in a warm-up of "
                f"{forwards} forwards of {cfg.layers} layers")
    if not on_rr and rr_ops:
        return f"it ran {rr_ops} ops on the ringreduce group, which it does not use"
    return None


def _gather(records: dict, world: int, control) -> dict:
    """Rank 0's view of every setup: the slowest rank's medians, its tokens, whether ranks agree."""
    import torch.distributed as dist

    mine = {k: {"ms_per_token": statistics.median(r["steps"]) * 1e3 if r["steps"] else None,
                "prefill_ms": statistics.median(r["prefill"]) * 1e3 if r["prefill"] else None,
                "warmup_s": r["warmup_s"], "tokens": r["tokens"], "error": r["error"]}
            for k, r in records.items()}
    every: list = [None] * world
    dist.all_gather_object(every, mine, group=control)
    out = {}
    for key, rec in mine.items():
        ranks = [e[key] for e in every]
        row = dict(rec)
        if rec["error"] is None:
            row["ms_per_token"] = max(x["ms_per_token"] for x in ranks)
            row["prefill_ms"] = max(x["prefill_ms"] for x in ranks)
            row["warmup_s"] = max(x["warmup_s"] for x in ranks)
            row["ranks_agree"] = all(x["tokens"] == rec["tokens"] for x in ranks)
            row["per_rank_ms_per_token"] = [x["ms_per_token"] for x in ranks]
        out[key] = row
    return out


def worker_main(argv: list[str]) -> None:
    """`tp_decode.py worker main|deepspeed --config JSON --out PATH`: one rank; rank 0 writes the
    launch's records to --out. The main launch rendezvouses through a FileStore (--store), the
    DeepSpeed one through MASTER_ADDR/MASTER_PORT as DeepSpeed's launcher sets them."""
    p = argparse.ArgumentParser(prog="tp_decode.py worker")
    p.add_argument("launch", choices=("main", "deepspeed"))
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--store")
    args = p.parse_args(argv)
    cfg = argparse.Namespace(**json.loads(args.config))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(cfg.threads)
    import torch.distributed as dist

    info: dict = {}
    groups: list = []  # held until the process leaves
    rr_ops = None  # the ringreduce group's op count, in the main launch
    if args.launch == "main":
        import ringreduce  # noqa: F401  (registers the backend)

        for name in ("recompile_limit", "cache_size_limit"):  # two compiled models share one forward
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        dist.init_process_group("ringreduce", store=dist.FileStore(args.store, world), rank=rank,
                                world_size=world)
        control = dist.new_group(backend="gloo")
        models, groups, rr_ops = _main_setups(cfg, rank, world)
        info["direct_op"] = hasattr(ringreduce, "all_reduce_")
    else:
        import deepspeed
        import deepspeed.comm as ds_comm
        from deepspeed.comm import comm as ds_state

        # gloo: DeepSpeed's CPU accelerator asks for oneCCL, which is not installed; the shm op does
        # the all-reduce, the process group only carries the fallback, which is checked not to run.
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        control = dist.new_group(backend="gloo")
        problem = peers_ranks.deepspeed_shm_problem(ds_state.cdb, "float32")
        problems: list = [None] * world
        dist.all_gather_object(problems, problem, group=control)
        reasons = sorted({p for p in problems if p})
        info["deepspeed"] = deepspeed.__version__
        sd = full_weights(cfg)
        shared = {k: nn.Parameter(sd[k], requires_grad=False) for k in ("embed.weight", "lm_head.weight")}
        split = build(cfg, sd, "split", rank, world, shared)
        del sd
        models = {DS_FLOOR: (split, None)}
        if reasons:
            models["split-deepspeed"] = (None, "shm op not loaded: " + "; ".join(reasons))
        else:
            models["split-deepspeed"] = (split, lambda t: ds_comm.inference_all_reduce(t))
        models[DS_DIRECT], rr_ops, rr_group = _direct_beside_deepspeed(split, world, control)
        groups.append(rr_group)
    records = _run_setups(cfg, rank, world, control, models, rr_ops)
    result = _gather(records, world, control)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": result, **info}, f)
    dist.barrier(group=control)
    # Leave without tearing the groups down: torch's gloo sometimes aborts in its exit handlers
    # (see ringreduce/_launch.py), which would turn a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------------
# Launching


def launch(kind: str, python: str, cfg: argparse.Namespace, tmp: str, timeout: float) -> dict:
    """Run one launch of `kind` ("main" or "deepspeed") over cfg.nproc ranks; rank 0's result."""
    out = os.path.join(tmp, f"{kind}.json")
    config = json.dumps(vars(cfg))
    worker = [SCRIPT, "worker", kind, "--config", config, "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), WORLD_SIZE=str(cfg.nproc))
    port = None
    if kind == "main":
        worker += ["--store", os.path.join(tmp, "store")]
    else:
        port = peers_launch.free_port()
        # What DeepSpeed's launcher sets: LOCAL_SIZE tells the shm op that all ranks share a host.
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu",
                   LOCAL_SIZE=str(cfg.nproc), LOCAL_WORLD_SIZE=str(cfg.nproc))
    logs = [os.path.join(tmp, f"{kind}-rank{r}.log") for r in range(cfg.nproc)]
    procs = []
    try:
        for r in range(cfg.nproc):
            with open(logs[r], "w") as f:
                procs.append(subprocess.Popen([python, *worker], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                              stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        peers_launch.wait_all(procs, logs, timeout, f"the {kind} launch")
    finally:
        peers_launch.kill_all(procs)
        if port is not None:  # DeepSpeed never unlinks its shm workspaces
            for r in range(cfg.nproc):
                path = f"/dev/shm/{peers_ranks.DS_SHM_PREFIX}_{os.getuid()}_127.0.0.1_{port}_{r}"
                if os.path.exists(path):
                    os.remove(path)
    with open(out) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------
# The report


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _params(cfg) -> tuple[int, int]:
    """(whole model's parameters, one rank's)."""
    h, m, v, n = cfg.hidden, cfg.mlp, cfg.vocab, cfg.nproc
    layer = 4 * h * h + 3 * h * m
    total = 2 * v * h + cfg.layers * (layer + 2 * h) + h
    return total, 2 * v * h + cfg.layers * (layer // n + 2 * h) + h


def header(cfg, ds_note: str) -> list[str]:
    total, per_rank = _params(cfg)
    head_dim = cfg.hidden // cfg.heads
    return [
        f"# tensor-parallel decode, {cfg.nproc} ranks: Llama-shaped decoder, hidden {cfg.hidden}, {cfg.layers} "
        f"layers, {cfg.heads} heads of {head_dim}, SwiGLU MLP {cfg.mlp}, vocab {cfg.vocab}; "
        f"{total / 1e6:.1f}M parameters (fp32), {per_rank / 1e6:.1f}M on each rank (embedding and LM head whole on every rank)",
        f"# batch 1, greedy: a {cfg.prompt}-token prompt (prefill), then {cfg.tokens} new tokens "
        f"({cfg.tokens - 1} decode steps after the prefill's); two all-reduces of {cfg.hidden * 4} bytes per "
        "layer and decode step",
        f"# {cfg.started}; host {socket.gethostname()}: {os.cpu_count()} cores, {peers_cpu.cpu_model()}; "
        f"Python {platform.python_version()}; torch {torch.__version__}, ringreduce {_version('ringreduce')}; "
        f"{cfg.threads} intra-op thread(s) per rank",
        f"# command: {cfg.command}",
        f"# timing: every setup warmed up (prefill + {WARMUP_TOKENS - 1} decode steps; torch.compile compiles "
        f"then), then {cfg.rounds} round(s), the order rotated each round; ms/token = the slowest rank's "
        "median over every decode step; tokens/s = 1000 / ms/token; prefill = the slowest rank's median "
        "prefill; warm-up = the first generation, compilation included",
        f"# compiled rows: torch.compile(model, backend={cfg.compile_backend!r}, dynamic=False)",
        f"# tokens: the last round's ids against {REFERENCE}'s (the reference)",
        f"# DeepSpeed: {ds_note}",
    ]


def _tokens_cell(key: str, row: dict, ref: dict | None) -> str:
    if row.get("error"):
        return "-"
    note = "" if row.get("ranks_agree", True) else ", ranks disagree"
    if key == REFERENCE:
        return "reference" + note
    if ref is None or ref.get("error") or ref.get("tokens") is None:
        return "no reference" + note
    a, b = row["tokens"], ref["tokens"]
    if a == b:
        return "match" + note
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    expected = " (no communication: expected)" if BY_KEY[key.split("@")[0]].comm == "none" else ""
    return f"differ from token {first + 1} of {len(b)}{note}{expected}"


def _label(key: str, cfg) -> str:
    if key == DS_FLOOR:
        return "hand-split, no communication, in DeepSpeed's launch"
    if key == DS_DIRECT:
        return "hand-split, ringreduce.all_reduce_, in DeepSpeed's launch"
    s = BY_KEY[key]
    label = s.label + (f" ({cfg.compile_backend})" if s.compiled else "")
    return label + (", own launch" if s.comm == "deepspeed" else "")


def _tps(rows: dict, key: str) -> float | None:
    row = rows.get(key)
    if not row or row.get("error") or not row.get("ms_per_token"):
        return None
    return 1e3 / row["ms_per_token"]


def report(cfg, rows: dict) -> list[str]:
    # The main launch's rows, then DeepSpeed's launch: its setup and its floor.
    keys = [s.key for s in SETUPS if s.key in rows and s.comm != "deepspeed"]
    keys += [k for k in ("split-deepspeed", DS_DIRECT, DS_FLOOR) if k in rows]
    ref = rows.get(REFERENCE)
    width = max(len(_label(k, cfg)) for k in keys) if keys else 10
    lines = [f"# {'setup':<21} {'description':<{width}} {'ms/token':>9} {'tokens/s':>9} {'prefill(ms)':>12} "
             f"{'warm-up(s)':>11}  tokens"]
    for key in keys:
        row = rows[key]
        label = _label(key, cfg)
        if row.get("error"):
            lines.append(f"  {key:<21} {label:<{width}} {'n/a':>9} {'n/a':>9} {'n/a':>12} "
                         f"{'n/a':>11}  {row['error']}")
            continue
        lines.append(f"  {key:<21} {label:<{width}} {row['ms_per_token']:9.2f} "
                     f"{1e3 / row['ms_per_token']:9.2f} {row['prefill_ms']:12.1f} {row['warmup_s']:11.1f}  "
                     f"{_tokens_cell(key, row, ref)}")

    def ratio(a: str, b: str) -> str:
        x, y = _tps(rows, a), _tps(rows, b)
        return f"{x / y:.2f}x" if x and y else "n/a"

    rr_split = "split-direct" if _tps(rows, "split-direct") else "split-rr"
    # Against DeepSpeed: the direct op timed in DeepSpeed's own launch where it ran there.
    against_ds = DS_DIRECT if _tps(rows, DS_DIRECT) else rr_split
    if "split-deepspeed" in rows:
        ds_floor, floor = _tps(rows, DS_FLOOR), _tps(rows, "split-none")
        if ds_floor and floor:
            lines.append(f"# DeepSpeed ran in a launch of its own: the no-communication floor there ran at "
                         f"{ds_floor:.2f} tokens/s, here at {floor:.2f} (how much the machine moved between launches)")
        if against_ds == DS_DIRECT:
            lines.append(f"# against DeepSpeed, ringreduce's hand-split row is {DS_DIRECT}: the direct op in the same "
                         "processes as DeepSpeed's op, in the same rounds")
        else:
            why = "the direct op" if rr_split == "split-direct" else "dist.all_reduce: the direct op did not run"
            lines.append(f"# against DeepSpeed, ringreduce's hand-split row is {rr_split} ({why}; "
                         f"{DS_DIRECT} did not run), from the other launch")
    direct, floor = _tps(rows, "split-direct"), _tps(rows, "split-none")
    at = f"{100 * direct / floor:.0f}%" if direct and floor else "n/a"
    lines.append(f"# hand-split: ringreduce direct op at {at} of the no-communication floor's tokens/s")
    for suffix, what in (("", "eager"), ("-compiled", "compiled")):
        rr, gloo, none = (_tps(rows, f"dtensor-{c}{suffix}") for c in ("rr", "gloo", "none"))
        if none and (rr or gloo):
            parts = [f"{name} at {100 * x / none:.0f}%" for name, x in (("ringreduce", rr), ("gloo", gloo)) if x]
            bound = f"; the floor is {none / gloo:.2f}x gloo's tokens/s, the most any all-reduce could give" if gloo else ""
            lines.append(f"# DTensor {what}: {' and '.join(parts)} of the no-communication floor's tokens/s{bound}")
    lines.append(f"# TP decode, {cfg.nproc} ranks: ringreduce = {ratio('dtensor-rr', 'dtensor-gloo')} gloo (DTensor eager), "
                 f"{ratio('dtensor-rr-compiled', 'dtensor-gloo-compiled')} gloo (DTensor compiled), "
                 f"{ratio(against_ds, 'split-deepspeed')} DeepSpeed (hand-split)")
    return lines


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/tp_decode.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--mlp", type=int, default=2816, help="the MLP's inner width (default 2816)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens, the prefill's included (default 64)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--setups", default="all", help=f"comma list of {', '.join(BY_KEY)}; or all (default)")
    p.add_argument("--rounds", type=int, default=3, help="timed generations per setup (default 3)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    p.add_argument("--compile-backend", default="aot_eager",
                   help="torch.compile backend of the compiled rows (default aot_eager; inductor also runs "
                        "where a C++ compiler is found, and compiles for minutes at the default size)")
    p.add_argument("--peers-python", default=DEFAULT_PEERS_PYTHON,
                   help="the python with DeepSpeed (default .venv-peers/bin/python)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one launch may take (default 1800)")
    p.add_argument("--json", metavar="FILE", help="also write the rows and the header here")
    args = p.parse_args(argv)
    if args.nproc < 2:
        p.error("--nproc must be at least 2")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        p.error("--hidden must be --heads times an even head size")
    if args.heads % args.nproc or args.mlp % args.nproc:
        p.error("--heads and --mlp must divide by --nproc")
    if args.tokens < 2 or args.prompt < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--tokens must be at least 2, --prompt, --rounds and --threads at least 1")
    chosen = [x.strip() for x in args.setups.split(",") if x.strip()]
    if chosen == ["all"]:
        chosen = list(BY_KEY)
    unknown = [x for x in chosen if x not in BY_KEY]
    if unknown or not chosen:
        p.error(f"--setups takes a comma list of {', '.join(BY_KEY)} (or all); unknown: {unknown}")
    args.setups = [k for k in BY_KEY if k in chosen]
    args.command = shlex.join(["python", os.path.relpath(SCRIPT), *argv])
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.started = datetime.datetime.now().isoformat(timespec="seconds")
    cfg = argparse.Namespace(**{k: getattr(args, k) for k in (
        "hidden", "layers", "heads", "mlp", "vocab", "prompt", "tokens", "nproc", "setups", "rounds",
        "threads", "compile_backend", "started", "command")})
    rows: dict = {}
    main_keys = [k for k in args.setups if k != "split-deepspeed"]
    ds_note = "left out by --setups"
    with tempfile.TemporaryDirectory(prefix="ringreduce-tp-decode-") as tmp:
        if main_keys:
            print(f"main launch: {', '.join(main_keys)}", file=sys.stderr, flush=True)
            try:
                got = launch("main", sys.executable, argparse.Namespace(**{**vars(cfg), "setups": main_keys}),
                             tmp, args.timeout)
            except peers_launch.LaunchFailed as e:
                print(e, file=sys.stderr)
                return 1
            rows.update(got["rows"])
        if "split-deepspeed" in args.setups:
            if not os.path.exists(args.peers_python):
                ds_note = f"skipped: {peers_native.shown(args.peers_python)} does not exist ({peers_launch.SETUP_HINT})"
                rows["split-deepspeed"] = {"error": ds_note}
            else:
                print("DeepSpeed launch: split-deepspeed and the floor", file=sys.stderr, flush=True)
                try:
                    got = launch("deepspeed", args.peers_python, cfg, tmp, args.timeout)
                    rows.update(got["rows"])
                    ds_note = (f"DeepSpeed {got.get('deepspeed')}, deepspeed.comm.inference_all_reduce after "
                               "deepspeed.init_distributed('gloo'), DS_ACCELERATOR=cpu, LOCAL_SIZE=ranks, in "
                               f"{peers_native.shown(args.peers_python)}; every rank checks its shm op is loaded "
                               "and in use")
                except peers_launch.LaunchFailed as e:
                    print(e, file=sys.stderr)
                    ds_note = f"its launch failed: {peers_launch.last_line(str(e))}"
                    rows["split-deepspeed"] = {"error": ds_note}
    head = header(cfg, ds_note)
    out = head + report(cfg, rows)
    print("\n".join(out), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": [h.lstrip("# ") for h in head], "config": vars(cfg),
                       "rows": rows, "summary": [x.lstrip("# ") for x in out[len(head):] if x.startswith("#")][1:]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))
