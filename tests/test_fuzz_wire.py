"""Fuzz tests (hypothesis) of what the TCP transport reads from a socket.

The checks are the very functions the transport's I/O thread applies (transport/tcp/wire.h,
exposed as ringreduce._C.wire): a hello before a connection is accepted, every frame head before
its body is read, the message header of a data frame and the body of a state frame. Each property
compares them with an independent model of the wire format written here from its description,
on arbitrary bytes and on valid messages with fields mutated. The last test sends generated
streams to a live rank's listener while the group runs (TCP pass of the suite, see test_tcp.py
for the fixed cases).
"""

import struct

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import harness  # noqa: E402

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# struct layouts of the wire format (little-endian, as on every host ringreduce runs on).
HELLO = struct.Struct("<QIiiIIIQQ16s")  # magic version rank world socket sockets reserved group slot secret
HEAD = struct.Struct("<II")
MSG = struct.Struct("<QQQHBBBBh")  # seq count bytes kind algo spare dtype redop root
STATE = struct.Struct("<QiI")

U32 = st.integers(0, 2**32 - 1)
I32 = st.integers(-2**31, 2**31 - 1)
U64 = st.integers(0, 2**64 - 1)


@pytest.fixture(scope="module")
def wire():
    from ringreduce import load_extension

    return load_extension().wire


EXPECT = dict(world=4, sockets=2, group=0x1234_5678_9ABC_DEF0, slot_bytes=4096,
              secret=bytes(range(16)))


def model_hello_ok(data: bytes, e=EXPECT) -> bool:
    if len(data) != HELLO.size:
        return False
    magic, version, rank, world, socket, sockets, _, group, slot, secret = HELLO.unpack(data)
    return (magic == 0x314F4C4C45485252 and version == 1 and secret == e["secret"]
            and group == e["group"] and world == e["world"] and 0 <= rank < e["world"]
            and sockets == e["sockets"] and socket < sockets and slot == e["slot_bytes"])


def good_hello(rank=1, socket=0):
    e = EXPECT
    return HELLO.pack(0x314F4C4C45485252, 1, rank, e["world"], socket, e["sockets"], 0, e["group"],
                      e["slot_bytes"], e["secret"])


def check_hello(wire, data):
    return wire.check_hello(data, EXPECT["world"], EXPECT["sockets"], EXPECT["group"],
                            EXPECT["slot_bytes"], EXPECT["secret"])


def test_the_struct_model_matches_the_sizes(wire):
    assert HELLO.size == wire.HELLO_BYTES
    assert MSG.size == wire.MSG_HEADER_BYTES
    assert STATE.size == wire.STATE_BYTES
    assert check_hello(wire, good_hello()) == ""


@SETTINGS
@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_a_hello(wire, data):
    why = check_hello(wire, data)
    assert isinstance(why, str)
    assert (why == "") == model_hello_ok(data), (data.hex(), why)
    assert EXPECT["secret"].hex() not in why  # a refusal never echoes the secret


FIELDS = ["magic", "version", "rank", "world", "socket", "sockets", "reserved", "group", "slot",
          "secret"]


@SETTINGS
@given(st.data())
def test_a_valid_hello_with_fields_changed(wire, data):
    values = list(HELLO.unpack(good_hello(rank=data.draw(st.integers(0, 3)),
                                          socket=data.draw(st.integers(0, 1)))))
    for i in sorted(set(data.draw(st.lists(st.integers(0, len(FIELDS) - 1), max_size=4)))):
        strategy = {0: U64, 7: U64, 8: U64, 2: I32, 3: I32, 9: st.binary(min_size=16, max_size=16)}
        values[i] = data.draw(strategy.get(i, U32), label=FIELDS[i])
    raw = HELLO.pack(*values)
    cut = data.draw(st.integers(0, len(raw)))  # also truncated
    raw = raw[:cut] if data.draw(st.booleans()) else raw
    why = check_hello(wire, raw)
    assert (why == "") == model_hello_ok(raw), (dict(zip(FIELDS, values)), len(raw), why)


def model_head_ok(t, n, slot):
    if t == 1:
        return 32 <= n <= 32 + slot
    if t == 2:
        return n <= 2048
    if t in (3, 4):
        return n == 0
    if t == 5:
        return n == 16
    return False


@SETTINGS
@given(st.one_of(U32, st.integers(0, 6)), st.one_of(U32, st.integers(0, 5000)),
       st.sampled_from([64, 4096, 128 << 10, 64 << 20]))
def test_frame_heads(wire, t, n, slot):
    why = wire.check_frame_head(t, n, slot)
    assert (why == "") == model_head_ok(t, n, slot), (t, n, slot, why)


@SETTINGS
@given(st.binary(min_size=32, max_size=32), st.one_of(U32, st.integers(0, 5000)))
def test_data_headers(wire, header, n):
    announced = MSG.unpack(header)[2]
    why = wire.check_data_header(header, n)
    assert (why == "") == (n >= 32 and announced == n - 32), (header.hex(), n, why)


@SETTINGS
@given(st.binary(min_size=16, max_size=16), st.integers(1, 64))
def test_state_bodies(wire, body, world):
    blocked = STATE.unpack(body)[1]
    why = wire.check_state_body(body, world)
    assert (why == "") == (-1 <= blocked < world), (body.hex(), world, why)


# ---- a live listener ----------------------------------------------------------------------------

def _rank_live_fuzz(ctx, seed, examples):
    """Rank 1 sends `examples` generated byte streams to rank 0's listener, each on a connection
    of its own, between all-reduces that must stay right."""
    import socket as so
    import random

    import torch
    import torch.distributed as dist
    from hypothesis import given as given_, settings as settings_, strategies as st_
    from hypothesis import HealthCheck as HC, Phase

    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    failures = []
    addr = [be.tcp_address()]
    dist.broadcast_object_list(addr, src=0)
    host, port = addr[0].rsplit(":", 1)

    def allreduce_check(i):
        x = torch.arange(10000, dtype=torch.float32) + ctx.rank + i
        dist.all_reduce(x)
        want = torch.arange(10000, dtype=torch.float32) * ctx.world_size + sum(
            r + i for r in range(ctx.world_size))
        if not torch.equal(x, want):
            failures.append(f"all-reduce {i} after hostile connections is wrong")

    allreduce_check(0)
    if ctx.rank == 1:
        rng = random.Random(seed)
        # A hello that is almost right (every rank's hello differs from it in the secret only, as
        # the test cannot know the job's secret), truncated or followed by junk.
        def streams():
            hello = good_hello(rank=1)
            return st_.one_of(
                st_.binary(max_size=300),
                st_.integers(0, len(hello)).map(lambda n: hello[:n]),
                st_.binary(max_size=100).map(lambda junk: hello + junk),
                st_.lists(st_.tuples(st_.integers(0, 7), st_.integers(0, 5000)), max_size=4).map(
                    lambda heads: hello + b"".join(HEAD.pack(t, n) for t, n in heads)),
            )

        sent = []

        @settings_(max_examples=examples, deadline=None, database=None, derandomize=True,
                   phases=[Phase.generate], suppress_health_check=list(HC))
        @given_(streams())
        def send_one(data):
            s = so.create_connection((host, int(port)), timeout=10)
            try:
                try:
                    s.sendall(data)
                    if rng.random() < 0.5:
                        s.shutdown(so.SHUT_WR)
                except OSError:
                    pass  # the listener may drop the connection before it has read it all
                # The listener must not answer: nothing here is a valid hello for this job.
                s.settimeout(0.2 if len(data) >= 64 else 0.02)
                try:
                    got = s.recv(64)
                except (so.timeout, ConnectionResetError):
                    got = b""
                if got:
                    failures.append(f"the listener answered {len(got)} bytes to {data[:80].hex()}")
            finally:
                s.close()
            sent.append(len(data))

        send_one()
        if len(sent) < examples // 2:
            failures.append(f"only {len(sent)} streams were sent")
    dist.barrier()
    for i in range(1, 4):
        allreduce_check(i)
    return failures, {}


def test_generated_streams_at_a_live_listener_change_nothing(ranks, standin):
    if standin:
        pytest.skip("ringreduce's TCP listener")
    pool = ranks(2, env={"RINGREDUCE_TRANSPORT": "tcp"})
    harness.check_results(pool.run(_rank_live_fuzz, 7, 150, timeout=300))
