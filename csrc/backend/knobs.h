// Every RINGREDUCE_* environment variable, in one table: its default, how its value is read, who
// reads it and what it does. Config (config.cpp) reads and prints the knobs of
// RINGREDUCE_CONFIG_KNOBS from it, the bindings hand the whole table to Python
// (ringreduce._C.knobs(), used by `python -m ringreduce.info`), and tests/test_knobs.py checks that
// docs/knobs.md gives every knob here with the same default, and no other. The other readers (the
// log, failpoints, the flight recorder, the TCP transport's interface, the Python package, the
// build, the tests) still read their own variables, where they need them; they are listed here so
// that the table is the whole list.
#pragma once

#include <cstddef>

namespace ringreduce {

// How a value is read.
enum class KnobKind {
  Bytes,   // a byte count with an optional K, M or G suffix (powers of 1024)
  Count,   // a non-negative integer
  Flag,    // 0 or 1
  Choice,  // one of a few words
  Text,    // free text (a path, an interface name, a pattern)
};

// Who reads it, and so whose value counts.
enum class KnobScope {
  Agreed,      // rank 0 reads it when a group is created; the other ranks adopt its value
  PerRank,     // each rank reads it for itself when a group is created
  PerProcess,  // read once per process
  Build,       // read when the extension is built
  Test,        // read by tests/ only
};

struct Knob {
  const char* name;
  const char* default_text;  // as docs/knobs.md gives it, without its markdown
  KnobKind kind;
  KnobScope scope;
  const char* meaning;  // one line; docs/knobs.md has the whole story
};

// The knobs Config reads and agrees on, in the order Config::to_string() prints them (the INFO
// line). X(field, variable, kind, default, meaning): `field` is Config's member, and to_string()'s
// key is the variable's name without RINGREDUCE_, in lower case.
#define RINGREDUCE_CONFIG_KNOBS(X)                                                                    \
  X(slice_bytes, "RINGREDUCE_SLICE_BYTES", Bytes, "128K; 512K with more ranks than CPUs",             \
    "payload of one message: the slice the ring pipelines (a multiple of 64, 64 to 64M)")            \
  X(slots, "RINGREDUCE_SLOTS", Count, "4", "slices in flight per link (2 to 64)")                     \
  X(stream, "RINGREDUCE_STREAM", Choice, "auto",                                                      \
    "how large ops write the slots a peer reads next: auto (measured), plain or stream")             \
  X(stream_bytes, "RINGREDUCE_STREAM_BYTES", Bytes, "4K",                                            \
    "the smallest op that RINGREDUCE_STREAM applies to; smaller ones write plainly")                 \
  X(spin, "RINGREDUCE_SPIN_US", Count, "50; 1 with more ranks than CPUs",                             \
    "how long a waiting rank spins before it yields or sleeps, in microseconds (0: no spin)")        \
  X(spin_max, "RINGREDUCE_SPIN_MAX_US", Count,                                                        \
    "1000; the spin with more ranks than CPUs or RINGREDUCE_SPIN_US set",                             \
    "how long the spin may grow, in microseconds, where waits keep ending soon after it")             \
  X(yield, "RINGREDUCE_YIELD_US", Count, "0; 2000 with more ranks than CPUs",                         \
    "then how long it yields its CPU before it sleeps, in microseconds")                             \
  X(async_start, "RINGREDUCE_ASYNC_START_US", Count, "1000",                                          \
    "how long an async op is left for its wait() to run before the progress thread starts it")      \
  X(transport, "RINGREDUCE_TRANSPORT", Choice, "auto",                                                \
    "auto (shared memory within a host, TCP between hosts), shm or tcp")                             \
  X(tcp_sockets, "RINGREDUCE_TCP_SOCKETS", Count, "2", "TCP connections per pair of ranks (1 to 16)") \
  X(check_fingerprints, "RINGREDUCE_CHECK_FINGERPRINTS", Flag, "1",                                   \
    "0 skips comparing each message's header with the op this rank is in")                           \
  X(cuda_slice_bytes, "RINGREDUCE_CUDA_SLICE_BYTES", Bytes, "8M",                                     \
    "payload of one message between GPUs (a multiple of 4096, 4K to 1G)")                            \
  X(cuda_transport, "RINGREDUCE_CUDA_TRANSPORT", Choice, "auto",                                      \
    "how CUDA tensors travel: auto, ipc or staged")                                                  \
  X(cuda_window_bytes, "RINGREDUCE_CUDA_WINDOW_BYTES", Bytes, "64M",                                  \
    "staging slot of the stream-ordered CUDA all-reduce (two per rank); 0 turns that path off")      \
  X(algo, "RINGREDUCE_ALGO", Choice, "auto",                                                          \
    "auto (by size and layout), ring, oneshot, twoshot or hierarchical")                             \
  X(window_bytes, "RINGREDUCE_WINDOW_BYTES", Bytes, "1M",                                             \
    "the largest op, per rank, of the shared window (0 turns one-shot and two-shot off)")            \
  X(fake_hosts, "RINGREDUCE_FAKE_HOSTS", Count, "0",                                                  \
    "cut the group into this many hosts of consecutive ranks that talk over TCP (0: probe)")

// The knobs read elsewhere. Y(variable, kind, scope, default, meaning).
#define RINGREDUCE_OTHER_KNOBS(Y)                                                                     \
  Y("RINGREDUCE_SOCKET_IFNAME", Text, PerRank, "unset",                                               \
    "the network interface whose IPv4 address the rank listens on for TCP peers")                    \
  Y("RINGREDUCE_FLIGHT_RECORDER", Count, PerRank, "1000",                                             \
    "how many of a group's last ops the flight recorder keeps (0: none)")                            \
  Y("RINGREDUCE_FLIGHT_DIR", Text, PerRank,                                                           \
    "$TMPDIR/ringreduce-flight (/tmp/ringreduce-flight without TMPDIR)",                              \
    "where flight-recorder dumps go")                                                                \
  Y("RINGREDUCE_DEBUG", Choice, PerProcess, "unset (silent)", "WARN, INFO or TRACE: what to log")     \
  Y("RINGREDUCE_DEBUG_FILE", Text, PerProcess, "unset (stderr)",                                      \
    "where log lines go instead of stderr (%h: host name, %p: process id)")                          \
  Y("RINGREDUCE_FAILPOINT", Text, PerProcess, "unset",                                                \
    "for tests: <name>:<rank>[:<n>] kills that rank at the named point")                             \
  Y("RINGREDUCE_AUTOLOAD", Flag, PerProcess, "1",                                                     \
    "0 makes the torch.backends entry point do nothing at `import torch`")                           \
  Y("RINGREDUCE_NO_CUDA", Flag, Build, "unset", "setup.py: build without the CUDA sources")           \
  Y("RINGREDUCE_KEEP_CXX", Flag, Build, "unset",                                                      \
    "scripts/gpu_check.sh: keep the environment's C++ compiler")                                     \
  Y("RINGREDUCE_TEST_BACKEND", Choice, Test, "ringreduce", "the backend under test: ringreduce or gloo") \
  Y("RINGREDUCE_TEST_SEED", Count, Test, "drawn once per session",                                    \
    "reproduces a test run (printed in its header)")                                                 \
  Y("RINGREDUCE_TEST_OP_TIMEOUT", Count, Test, "60", "the test ranks' process-group timeout, seconds") \
  Y("RINGREDUCE_TEST_MAX_RANKS", Count, Test, "10", "live test rank processes before idle ones close") \
  Y("RINGREDUCE_SOAK_OPS", Count, Test, "1000", "ops in tests/test_soak.py")

#define RINGREDUCE_KNOB_FROM_CONFIG(field, name, kind, def, meaning) \
  Knob{name, def, KnobKind::kind, KnobScope::Agreed, meaning},
#define RINGREDUCE_KNOB_FROM_OTHER(name, kind, scope, def, meaning) \
  Knob{name, def, KnobKind::kind, KnobScope::scope, meaning},

inline constexpr Knob kKnobs[] = {RINGREDUCE_CONFIG_KNOBS(RINGREDUCE_KNOB_FROM_CONFIG)
                                      RINGREDUCE_OTHER_KNOBS(RINGREDUCE_KNOB_FROM_OTHER)};

#undef RINGREDUCE_KNOB_FROM_CONFIG
#undef RINGREDUCE_KNOB_FROM_OTHER

inline const char* knob_kind_name(KnobKind k) {
  switch (k) {
    case KnobKind::Bytes: return "bytes";
    case KnobKind::Count: return "count";
    case KnobKind::Flag: return "flag";
    case KnobKind::Choice: return "choice";
    case KnobKind::Text: return "text";
  }
  return "?";
}

inline const char* knob_scope_name(KnobScope s) {
  switch (s) {
    case KnobScope::Agreed: return "agreed";
    case KnobScope::PerRank: return "per rank";
    case KnobScope::PerProcess: return "per process";
    case KnobScope::Build: return "build";
    case KnobScope::Test: return "test";
  }
  return "?";
}

}  // namespace ringreduce
