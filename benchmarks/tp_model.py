"""The model of benchmarks/tp_decode.py: a Llama-shaped decoder (token embedding, pre-norm blocks of
RMSNorm, attention with rotary embeddings and a preallocated KV cache, a SwiGLU MLP; a final RMSNorm
and an LM head), its random weights from one seed, each rank's shards of it (whole for DTensor to
shard, or split by hand, Megatron-style), DTensor's plan over a mesh, and greedy decoding.

It imports only torch: tp_decode.py's DeepSpeed ranks load it in .venv-peers' python too.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

SEED = 1234


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding, the rotate-half form: x is (batch, heads, tokens, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Multi-head attention with a KV cache preallocated for the whole generation.

    The projections are built at `proj_heads` heads (all of them for a model that DTensor will shard,
    this rank's share for a hand-split one); the number of heads a forward works on is read from the
    projection's output, so the same code runs whole, DTensor-sharded and hand-split. The cache holds
    `cache_heads` heads (this rank's). Positions and the mask are tensors and the cache is written
    with index_copy_, so every decode step has the same shapes: torch.compile compiles one graph for
    the prefill and one for every decode step.
    """

    def __init__(self, hidden: int, proj_heads: int, cache_heads: int, head_dim: int, max_len: int):
        super().__init__()
        self.head_dim = head_dim
        width = proj_heads * head_dim
        self.q_proj = nn.Linear(hidden, width, bias=False)
        self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        self.o_proj = nn.Linear(width, hidden, bias=False)
        # Owned by this module, written in place at each step's positions; stale entries beyond the
        # current position are masked out, so a new generation need not clear them.
        self.register_buffer("k_cache", torch.zeros(1, cache_heads, max_len, head_dim), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, cache_heads, max_len, head_dim), persistent=False)
        self.reduce = None  # the hand-split model's all-reduce (in place); DTensor's o_proj does its own

    def forward(self, x, positions, cos, sin, mask):
        b, t, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        heads = q.shape[-1] // self.head_dim
        q, k, v = (y.view(b, t, heads, self.head_dim).transpose(1, 2) for y in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        out = self.o_proj(out.transpose(1, 2).reshape(b, t, heads * self.head_dim))
        if self.reduce is not None:
            self.reduce(out)
        return out


class MLP(nn.Module):
    def __init__(self, hidden: int, mlp: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, mlp, bias=False)
        self.up_proj = nn.Linear(hidden, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, hidden, bias=False)
        self.reduce = None

    def forward(self, x):
        out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if self.reduce is not None:
            self.reduce(out)
        return out


class Block(nn.Module):
    def __init__(self, hidden, proj_heads, cache_heads, head_dim, mlp, max_len):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, proj_heads, cache_heads, head_dim, max_len)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = MLP(hidden, mlp)

    def forward(self, x, positions, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), positions, cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg, proj_heads: int, cache_heads: int, mlp: int):
        super().__init__()
        head_dim = cfg.hidden // cfg.heads
        max_len = cfg.prompt + cfg.tokens
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, proj_heads, cache_heads, head_dim, mlp, max_len)
                                    for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.register_buffer("cos", torch.empty(max_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, head_dim), persistent=False)
        self.register_buffer("arange", torch.empty(max_len, dtype=torch.long), persistent=False)

    @classmethod
    def empty(cls, cfg, proj_heads: int, cache_heads: int, mlp: int) -> Decoder:
        """A model whose weights are to be loaded: built on the meta device (no random init of
        weights that are overwritten at once), then given memory and its buffers."""
        with torch.device("meta"):
            model = cls(cfg, proj_heads, cache_heads, mlp)
        model.to_empty(device="cpu")
        max_len, head_dim = model.cos.shape
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        model.cos.copy_(angles.cos())
        model.sin.copy_(angles.sin())
        model.arange.copy_(torch.arange(max_len))
        for block in model.blocks:
            block.attn.k_cache.zero_()
            block.attn.v_cache.zero_()
        return model

    def set_reduce(self, fn) -> None:
        for block in self.blocks:
            block.attn.reduce = block.mlp.reduce = fn

    def forward(self, tokens, start):
        """The logits of the last position of `tokens` (1, t), whose first is at position `start`
        (a 0-dim tensor, so that a new position is not a new graph under torch.compile)."""
        positions = start + self.arange[: tokens.shape[1]]
        cos, sin = self.cos[positions], self.sin[positions]
        mask = self.arange[None, :] <= positions[:, None]  # (t, max_len): causal, and nothing unwritten
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions, cos, sin, mask)
        return self.lm_head(self.norm(x[:, -1:]))


def full_weights(cfg) -> dict:
    """The whole model's weights, the same on every rank (one generator, one seed)."""
    g = torch.Generator().manual_seed(SEED)
    h, m = cfg.hidden, cfg.mlp

    def linear(out_features, in_features):
        return torch.randn(out_features, in_features, generator=g) / in_features ** 0.5

    sd = {"embed.weight": torch.randn(cfg.vocab, h, generator=g)}
    for i in range(cfg.layers):
        p = f"blocks.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"attn.{name}.weight"] = linear(h, h)
        sd[p + "mlp.gate_proj.weight"] = linear(m, h)
        sd[p + "mlp.up_proj.weight"] = linear(m, h)
        sd[p + "mlp.down_proj.weight"] = linear(h, m)
        sd[p + "attn_norm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
        sd[p + "mlp_norm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    sd["norm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    sd["lm_head.weight"] = linear(cfg.vocab, h)
    return sd


COLUMN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("attn.o_proj", "mlp.down_proj")


def build(cfg, sd: dict, form: str, rank: int, world: int, shared: dict) -> Decoder:
    """A model on this rank: the whole model (form "dtensor", for parallelize_module to shard) or
    this rank's column and row shards (form "split"). The embedding and LM head are the tensors of
    `shared`, one copy for every setup."""
    local_heads = cfg.heads // world
    if form == "dtensor":
        model = Decoder.empty(cfg, cfg.heads, local_heads, cfg.mlp)
        mine = {k: v for k, v in sd.items() if k not in shared}
    else:
        model = Decoder.empty(cfg, local_heads, local_heads, cfg.mlp // world)
        mine = {}
        for k, v in sd.items():
            if k in shared:
                continue
            if any(f".{name}." in k for name in COLUMN):
                v = v.chunk(world, dim=0)[rank]
            elif any(f".{name}." in k for name in ROW):
                v = v.chunk(world, dim=1)[rank]
            mine[k] = v
    missing, unexpected = model.load_state_dict(mine, strict=False)
    assert not unexpected and sorted(missing) == sorted(shared), (missing, unexpected)
    model.embed.weight = shared["embed.weight"]
    model.lm_head.weight = shared["lm_head.weight"]
    return model.eval()


def parallelize(model: Decoder, group, comm: str):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    # A mesh dimension named after the setup's communication: DeviceMesh compares equal, and hashes
    # alike, by ranks, device type and dimension names, not by its group, and DTensor caches what
    # its ops produce (their outputs' meshes) by mesh. Two unnamed meshes over the same ranks on two
    # groups are then one: every all-reduce of the second model to run went through the group of
    # the first (torch 2.13), so DTensor on ringreduce ran on gloo.
    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=(f"tp-{comm}",))
    plan = {f"blocks.*.{name}": ColwiseParallel() for name in COLUMN}
    plan.update({f"blocks.*.{name}": RowwiseParallel() for name in ROW})
    # Every rank holds the same whole weights: each keeps its own shard, nothing is sent.
    parallelize_module(model, mesh, plan, src_data_rank=None)
    return model


def generate(model, prompt, tokens: int):
    """Greedy decoding: (prefill seconds, decode step seconds, generated ids)."""
    start = time.perf_counter()
    tok = model(prompt, torch.tensor(0)).argmax(-1)  # (1, 1)
    prefill = time.perf_counter() - start
    out, steps = [tok], []
    for i in range(tokens - 1):
        start = time.perf_counter()
        tok = model(tok, torch.tensor(prompt.shape[1] + i)).argmax(-1)
        steps.append(time.perf_counter() - start)
        out.append(tok)
    return prefill, steps, torch.cat(out, dim=1)[0].tolist()
