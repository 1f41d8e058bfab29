"""Reference arithmetic shared by the tests: the dtype and op tables (what the backend must
support, what gloo does), fresh random inputs per case, the exact or float64 / complex128
result of a reduction, and the tolerance rules for comparing a backend's result with it.

torch is imported lazily (inside the functions) so that a rank process of the harness's pool
can apply its environment before torch (and the backend) are imported.
"""

from __future__ import annotations

DTYPE_NAMES = [
    "float32", "float64", "float16", "bfloat16",
    "int8", "uint8", "int16", "int32", "int64",
    "bool", "complex64", "complex128",
]
FLOAT_NAMES = ["float32", "float64", "float16", "bfloat16"]
INT_NAMES = ["int8", "uint8", "int16", "int32", "int64"]
COMPLEX_NAMES = ["complex64", "complex128"]


def dtype_of(name):
    import torch

    return getattr(torch, name)


def ops_for(dtype_name):
    """Every op the backend must support for this dtype (the sweep's op axis)."""
    if dtype_name in FLOAT_NAMES:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
    if dtype_name in COMPLEX_NAMES:
        # dist.all_reduce refuses PRODUCT on complex in Python (torch's supports_complex()),
        # and hands SUM/AVG/PREMUL_SUM to the backend as view_as_real float tensors; the
        # sweep reaches complex PRODUCT through the ProcessGroup.allreduce binding.
        return ["SUM", "AVG", "PRODUCT", "PREMUL_SUM"]
    if dtype_name in INT_NAMES:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dtype_name == "bool":
        # bool AVG is an error (tested in test_semantics).
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    raise ValueError(dtype_name)


def gloo_supports(dtype_name, op):
    """What torch 2.13's gloo backend does on CPU, probed by hand (all_reduce and broadcast):

    * int16: nothing at all ("Invalid scalar type"), not even broadcast;
    * PREMUL_SUM: never ("Cannot use ReduceOp.PREMUL_SUM with Gloo");
    * AVG: floating and complex only (on integer and bool it computes a float mean and
      fails "result type Float can't be cast to the desired output type");
    * complex PRODUCT via ProcessGroup.allreduce: refused ("does not support on complex");
    * float16 and bfloat16: SUM, AVG, PRODUCT, MIN, MAX all work;
    * BAND/BOR/BXOR: integer and bool only (as for every backend).
    """
    if dtype_name == "int16" or op == "PREMUL_SUM":
        return False
    if op == "AVG" and dtype_name not in FLOAT_NAMES + COMPLEX_NAMES:
        return False
    if dtype_name in COMPLEX_NAMES and op == "PRODUCT":
        return False
    return True


def standin_skip(dtype_name, op):
    """With gloo standing in for the backend under test, the cases it cannot pass:
    those it does not support, and bool SUM (gloo adds the bytes and leaves 2s in a bool
    tensor; ringreduce must store canonical 0/1)."""
    return not gloo_supports(dtype_name, op) or (dtype_name == "bool" and op == "SUM")


def gloo_broadcast_supports(dtype_name):
    return dtype_name != "int16"


# Tolerances for floating results, relative to the scale of the exact result:
# sum_i |x_i| for SUM/AVG/PREMUL_SUM (so cancellation in a random-sign sum does not
# blow up a relative check), |prod_i x_i| for PRODUCT.  A ring of n ranks rounds each
# partial sum once per hop (n-1 roundings, plus one for AVG or the premultiply), so
# these leave room for 4 ranks even when fp16/bf16 partial results are kept in the
# narrow type (unit roundoff 2^-11 for fp16, 2^-8 for bf16).
RTOL = {
    "float16": 1e-2,
    "bfloat16": 2e-2,
    "float32": 1e-5,
    "float64": 1e-12,
    "complex64": 1e-5,
    "complex128": 1e-12,
}

# Plus an absolute tolerance for fp16, whose subnormals (below 6.1e-5) are spaced 6e-8
# apart: a product or quotient that lands there is off by up to half of that per rounding.
ATOL = {"float16": 2.0**-22}

_INT_INFO = {
    # name: (min, max) of the dtype
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


def _int_range(dtype_name, op, world):
    """Value range for integer inputs: wide enough to matter, narrow enough that the
    exact int64 reference is right and the backend never hits signed overflow (UB)."""
    lo, hi = _INT_INFO[dtype_name]
    if op in ("MIN", "MAX", "BAND", "BOR", "BXOR"):
        return lo, hi
    if op == "SUM":
        # 8/16-bit sums wrap modulo 2^k, which is order independent: test the wrap.
        if dtype_name in ("int8", "uint8", "int16"):
            return lo, hi
        return (-(2**28), 2**28) if dtype_name == "int32" else (-(2**60), 2**60)
    if op == "AVG":
        # The sum must fit the dtype: AVG is the C-style (truncating) division of the sum.
        m = (hi // max(world, 1))
        return (0 if lo == 0 else -m), m
    if op == "PRODUCT":
        if dtype_name in ("int8", "uint8", "int16"):
            return lo, hi  # wrapped products, exact modulo 2^k, via an int64 reference
        return (-50, 50) if dtype_name == "int32" else (-(2**15), 2**15)
    raise ValueError(op)


def make_input(gen, dtype_name, count, op, world, shape=None):
    """Fresh random input for one rank of one case (never all zeros or ones).

    Floats: N(0,1) (PRODUCT: +-U(1,2) so fp16 products of 4 stay in range);
    complex: N(0,1) + i N(0,1) (PRODUCT: modulus U(1,1.5), random angle);
    integers: see _int_range; bool: fair coin.
    """
    import torch

    shape = (count,) if shape is None else shape
    n = 1
    for s in shape:
        n *= s
    dt = dtype_of(dtype_name)
    if dtype_name in FLOAT_NAMES:
        if op == "PRODUCT":
            mag = 1 + torch.rand(n, generator=gen, dtype=torch.float64)
            sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1
            x = mag * sign
        else:
            x = torch.randn(n, generator=gen, dtype=torch.float64)
        return x.to(dt).reshape(shape)
    if dtype_name in COMPLEX_NAMES:
        if op == "PRODUCT":
            mag = 1 + 0.5 * torch.rand(n, generator=gen, dtype=torch.float64)
            ang = 2 * torch.pi * torch.rand(n, generator=gen, dtype=torch.float64)
            x = torch.polar(mag, ang)
        else:
            x = torch.complex(
                torch.randn(n, generator=gen, dtype=torch.float64),
                torch.randn(n, generator=gen, dtype=torch.float64),
            )
        return x.to(dt).reshape(shape)
    if dtype_name == "bool":
        return torch.randint(0, 2, (n,), generator=gen).to(torch.bool).reshape(shape)
    lo, hi = _int_range(dtype_name, op, world)
    if op == "PRODUCT" and dtype_name in ("int32", "int64"):
        mag = torch.randint(1, hi + 1, (n,), generator=gen, dtype=torch.int64)
        sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) * 2 - 1
        x = mag * sign
    elif dtype_name == "int64" and hi == 2**63 - 1:
        x = torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64)  # high exclusive
    else:
        x = torch.randint(lo, hi + 1, (n,), generator=gen, dtype=torch.int64)
    return x.to(dt).reshape(shape)


def reduce_op(op, factor=None):
    import torch.distributed as dist

    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


def reference(inputs, dtype_name, op, factor=None):
    """The exact (integers, bool, MIN/MAX) or float64/complex128 result of reducing
    ``inputs`` (one tensor per rank) with ``op``.

    Integers are reduced in int64 and cast back (wrapping modulo 2^k like the dtype);
    AVG on integers is the sum divided by the world size, truncated toward zero.
    bool: SUM and MAX are OR, PRODUCT and MIN are AND, BXOR is parity.
    """
    import torch

    world = len(inputs)
    dt = dtype_of(dtype_name)
    if dtype_name in FLOAT_NAMES or dtype_name in COMPLEX_NAMES:
        wide = torch.complex128 if dtype_name in COMPLEX_NAMES else torch.float64
        x = torch.stack([t.to(wide) for t in inputs])
        if op == "SUM":
            return x.sum(0)
        if op == "AVG":
            return x.sum(0) / world
        if op == "PREMUL_SUM":
            return (x * factor).sum(0)
        if op == "PRODUCT":
            return x.prod(0)
        if op == "MIN":
            return x.min(0).values.to(dt)
        if op == "MAX":
            return x.max(0).values.to(dt)
        raise ValueError(op)
    x = torch.stack([t.to(torch.int64) for t in inputs])
    if op in ("BAND", "BOR", "BXOR"):
        f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        acc = x[0]
        for i in range(1, world):
            acc = f(acc, x[i])
        r = acc
    elif op == "SUM":
        r = x.sum(0)
    elif op == "AVG":
        r = torch.div(x.sum(0), world, rounding_mode="trunc")
    elif op == "PRODUCT":
        r = x.prod(0)
    elif op == "MIN":
        r = x.min(0).values
    elif op == "MAX":
        r = x.max(0).values
    else:
        raise ValueError(op)
    if dtype_name == "bool":
        return r != 0
    return r.to(dt)


def float_scale(inputs, dtype_name, op, factor=None):
    """Per-element scale for the tolerance (see RTOL)."""
    import torch

    world = len(inputs)
    if dtype_name in COMPLEX_NAMES:
        x = torch.stack([torch.view_as_real(t.to(torch.complex128)) for t in inputs])
        if op == "PRODUCT":
            mod = torch.stack([t.to(torch.complex128).abs() for t in inputs]).prod(0)
            return torch.stack([mod, mod], dim=-1)
    else:
        x = torch.stack([t.to(torch.float64) for t in inputs])
        if op == "PRODUCT":
            return x.abs().prod(0)
    s = x.abs().sum(0)
    if op == "AVG":
        s = s / world
    elif op == "PREMUL_SUM":
        s = s * abs(factor)
    return s


def exact_kind(dtype_name, op):
    return dtype_name not in FLOAT_NAMES + COMPLEX_NAMES or op in ("MIN", "MAX")


def compare(out, ref, dtype_name, op, scale=None, slack=1.0):
    """None if ``out`` matches ``ref``, else a one-line description of the mismatch.

    Exact kinds (integers, bool, MIN/MAX) must match bit for bit (bool outputs must be
    0/1 bytes); floats within RTOL[dtype] * scale * slack element-wise.
    """
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {tuple(out.shape)} != expected {tuple(ref.shape)}"
    if out.numel() == 0:
        return None
    if exact_kind(dtype_name, op):
        if dtype_name == "bool":
            o = out.contiguous().view(torch.uint8)
            e = ref.to(torch.bool).contiguous().view(torch.uint8)
        else:
            o, e = out, ref.to(out.dtype)
        bad = (o != e).reshape(-1)
        if dtype_name in FLOAT_NAMES:  # MIN/MAX: equal values (signed zeros aside)
            bad = bad & ~(torch.isnan(o) & torch.isnan(e)).reshape(-1)
        nbad = int(bad.sum())
        if nbad == 0:
            return None
        i = int(bad.nonzero()[0])
        return (f"{nbad}/{out.numel()} elements differ; first at flat index {i}: "
                f"got {o.reshape(-1)[i].item()!r}, expected {e.reshape(-1)[i].item()!r}")
    if dtype_name in COMPLEX_NAMES:
        o = torch.view_as_real(out.to(torch.complex128))
        e = torch.view_as_real(ref.to(torch.complex128))
    else:
        o = out.to(torch.float64)
        e = ref.to(torch.float64)
    tol = slack * (RTOL[dtype_name] * (scale if scale is not None else e.abs()) + ATOL.get(dtype_name, 0.0)) + 1e-300
    err = (o - e).abs()
    bad = (~(err <= tol)).reshape(-1)  # NaN counts as bad
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    ratio = (err / tol).reshape(-1)
    i = int(torch.nan_to_num(ratio, nan=float("inf")).argmax())
    return (f"{nbad}/{o.numel()} elements outside rtol {RTOL[dtype_name] * slack:g} x scale; worst at "
            f"flat index {i}: got {o.reshape(-1)[i].item()!r}, expected {e.reshape(-1)[i].item()!r} "
            f"(|err| = {err.reshape(-1)[i].item():.3g}, allowed {tol.reshape(-1)[i].item():.3g})")


