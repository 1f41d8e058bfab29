// The knobs a group is set up with, read from the environment as backend/knobs.h lists them
// (documented in docs/knobs.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algo/select.h"
#include "algo/handoff.h"
#include "transport/links.h"

namespace ringreduce {

class Bootstrap;

struct Config {
  // Payload of one message = the slice the ring pipelines: see default_slice_bytes().
  size_t slice_bytes = 128 << 10;
  // Slots per link: how many slices a rank may be ahead of its successor.
  uint32_t slots = 4;
  // How ops of at least stream_bytes write the slots their peers read next: measured (auto),
  // plainly or with non-temporal stores (algo/handoff.h; RINGREDUCE_STREAM, _STREAM_BYTES).
  SlotWrites::Mode stream = SlotWrites::Mode::Auto;
  size_t stream_bytes = 4u << 10;
  // How long a waiting rank spins before it sleeps on a futex: see default_spin().
  std::chrono::microseconds spin{50};
  // How long that spin may grow where waits keep ending soon after it (AdaptiveSpin,
  // transport/wait.h); at most `spin`: a fixed spin. See default_spin_max().
  std::chrono::microseconds spin_max{1000};
  // Then how long it yields its CPU before it sleeps: see default_yield().
  std::chrono::microseconds yield{0};
  // How long an async host op waits for its wait() to run it before the progress thread starts
  // it (OpQueue::push); 0 starts it at once.
  std::chrono::microseconds async_start{1000};
  // Which transports carry the ring: by probe (auto), shared memory only, or TCP only
  // (RINGREDUCE_TRANSPORT).
  TransportMode transport = "auto";
  // TCP connections per pair of ranks on different hosts (RINGREDUCE_TCP_SOCKETS).
  uint32_t tcp_sockets = 2;
  // Compare every message's header with the op this rank is in (RINGREDUCE_CHECK_FINGERPRINTS).
  // Off only to measure what the check costs: payload sizes are still checked, so memory stays
  // safe, but ranks that disagree would reduce mismatched data instead of failing.
  bool check_fingerprints = true;
  // Payload of one message between GPUs (RINGREDUCE_CUDA_SLICE_BYTES): a device slot. Every
  // message costs a stream synchronisation and a hand-off between processes (a few
  // microseconds), so slices of megabytes keep that under the time the kernels take.
  size_t cuda_slice_bytes = 8 << 20;
  // Which algorithm every call takes where it can (RINGREDUCE_ALGO): auto (by size, algo/select.h),
  // ring, oneshot or twoshot.
  Algo algo = Algo::Auto;
  // The largest message, per rank, that the one-shot and two-shot algorithms carry
  // (RINGREDUCE_WINDOW_BYTES); 0 turns them off. The window's size follows (ShmConfig).
  size_t window_bytes = 1u << 20;
  // How CUDA tensors travel (RINGREDUCE_CUDA_TRANSPORT): "auto" (CUDA IPC where every rank can
  // open every other's device memory, else staged through host memory, said once), "ipc" (fail
  // when it cannot be used) or "staged".
  std::string cuda_transport = "auto";
  size_t cuda_window_bytes = 64 << 20;  // 0: no stream-ordered CUDA all-reduce
  // Ranks cut into this many "hosts" of consecutive ranks, which talk over TCP as if on other
  // machines (RINGREDUCE_FAKE_HOSTS, 0: the hosts the probe finds): runs the multi-host
  // algorithms on one machine, for tests and the benchmark.
  int fake_hosts = 0;

  // Defaults (the spin one for `local_ranks` ranks on this host) overridden by the variables of
  // RINGREDUCE_CONFIG_KNOBS (backend/knobs.h). Throws ringreduce::Error naming the variable when a
  // value does not parse or is out of range.
  static Config from_env(int local_ranks);

  // With a core per rank, a spin turns most hand-offs into a cache-line transfer instead of a
  // futex wake-up. With more ranks than cores, the peer a rank waits for is often waiting for that
  // very core, and every microsecond of spin delays it: a short spin. docs/knobs.md has the sweep.
  static std::chrono::microseconds default_spin(int local_ranks);
  // With a core per rank the spin adapts up to 1 ms: a rank that sleeps pays a wake-up (50-100 us
  // in a VM) which puts it behind its peer, whose next wait then outlasts a short spin too, and
  // so on every op. With more ranks than cores a spin delays the peer it waits for: fixed.
  static std::chrono::microseconds default_spin_max(int local_ranks);
  // With more ranks than cores a rank waits, most of the time, for a peer that is runnable but
  // has no core; yielding gives it one at once, where a futex sleep costs a wake-up per hand-off
  // (4 ranks on 2 cores, 1 KiB all-reduce: see docs/algorithms.md). The yield is bounded so that
  // a rank with nothing to do goes to sleep. With a core per rank it is not needed.
  static std::chrono::microseconds default_yield(int local_ranks);

  // With a core per rank, slices small enough that a link's slots stay in cache win. With more
  // ranks than cores every hand-off may cost a context switch, so fewer, larger slices win.
  // docs/knobs.md has the sweep.
  static size_t default_slice_bytes(int local_ranks);

  // Every rank must slice the same way, so rank 0's values win: rank 0 reads its environment
  // (from_env, with the defaults for the ranks on its host) and publishes the result through the
  // store under `prefix`, and the others adopt it. Only rank 0 parses the variables, so a bad
  // value fails there, naming the variable, and the others fail with the store's timeout rather
  // than on values they would not use. Collective over the group's `size` ranks: each says which
  // machine it runs on (local_ranks()).
  static Config agree(Bootstrap& bs, const std::string& prefix, int rank, int size);

  // How many of the group's ranks share rank 0's machine, as agree() counts them: ranks whose
  // kernel has the same boot id (the same machine, whatever container each is in), and with
  // RINGREDUCE_FAKE_HOSTS those of rank 0's fake host only. `keys[r]`: rank r's machine.
  static int local_ranks(const std::vector<std::string>& keys, int fake_hosts);
  // This machine's key for local_ranks().
  static std::string machine_key();

  // What agree() warns about (once per process each, as a torch warning): a RINGREDUCE_* variable
  // in `env` that is no knob (naming the closest one), and on ranks other than 0, an agreed knob
  // whose value here differs from rank 0's, which is the one in force.
  static std::vector<std::string> knob_warnings(const Config& agreed, int rank, char** env);
  static std::string closest_knob(const std::string& name);
  // The ranks on rank 0's machine that agree() counted, its defaults were chosen for (0 before).
  int local_ranks_seen = 0;

  // "slice_bytes=131072 slots=4 ...": every knob of RINGREDUCE_CONFIG_KNOBS, its variable's name
  // without RINGREDUCE_ in lower case, with its value. The INFO line ends with it, and agree()
  // publishes it.
  std::string to_string() const;

 private:
  // More ranks on this host than CPUs this process may run on.
  static bool oversubscribed(int local_ranks);
};

}  // namespace ringreduce
