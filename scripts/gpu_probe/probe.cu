// The GPU probe: how ranks of one job, each a process of its own on the same GPU, can order their
// work through the device instead of through host waits (issue 32, item 1), timed on one
// all-reduce so that the figures compare. It prints one table.
//
//   gpu_probe [--ranks 2,4] [--sizes 8K,256K,8M,256M] [--iters N] [--timeout S] [--only NAME,...]
//
// Every candidate runs the same one-shot all-reduce (float32 sum) of each size: each rank copies
// its input into a staging buffer that every other rank has mapped through CUDA IPC (two slots,
// alternating, so that one ordering point per op suffices), says so, waits until every peer has
// said so for this op, and then reduces all the staging buffers, in rank order, into its output.
// The candidates differ only in how "says so" and "waits" are done:
//
//   host       the host synchronises its stream, then bumps a counter in host shared memory that
//              the peers' hosts spin on (what the library's GPU path does today, per message);
//   ipc-event  an interprocess event recorded on the stream; a peer's stream waits on it
//              (cudaStreamWaitEvent) once its host has seen the record published in host memory;
//   mem-dev    stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32) on counters
//              in IPC-mapped device memory: the host never waits;
//   mem-host   the same on counters in host shared memory registered with CUDA, which the hosts
//              can also read (a watchdog sees the device's progress without a device call);
//   leader     rank 0 alone reduces, reading every staging buffer and writing every rank's
//              result, ordered with mem-dev: one kernel per op on the GPU instead of one per rank;
//   spin       a one-thread kernel that spins on the peer's IPC-mapped counter (with a deadline
//              of its own): kernels of different processes do not run at once without MPS.
//
// Plus `wait-return`: how long the host takes to make a stream wait on an event while the work
// behind it still runs (what a stream-ordered Work.wait() costs), and `kernel`: the reduction
// kernel alone in one process (the floor of the device work).
//
// Each candidate and world size runs in fresh processes, forked before any CUDA call, under a
// deadline: one that hangs is killed and reported as such, and the next one still runs.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr int kMaxRanks = 8;
constexpr int kEvents = 64;   // interprocess events per rank, reused round-robin

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the ranks of one run share through host memory (mapped before fork).
struct Shared {
  std::atomic<int> arrived[4];             // barrier counters, one per barrier use
  std::atomic<uint64_t> seq[kMaxRanks];    // host / ipc-event: last op signalled by each rank
  std::atomic<uint64_t> waited[kMaxRanks][kMaxRanks];  // ipc-event: [waiter][owner] last op waited
  alignas(64) uint32_t host_flags[kMaxRanks * 16];    // mem-host: one counter per rank, 64 B apart
  cudaIpcMemHandle_t stage[kMaxRanks];
  cudaIpcMemHandle_t flags[kMaxRanks];
  cudaIpcMemHandle_t out_stage[kMaxRanks];
  cudaIpcEventHandle_t events[kMaxRanks][kEvents];
  double op_us[kMaxRanks];
  double enqueue_us[kMaxRanks];
  long wrong[kMaxRanks];
  char error[kMaxRanks][256];
  double deadline;  // absolute, now_s() clock
};

Shared* g_sh = nullptr;
int g_rank = 0;

[[noreturn]] void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_sh->error[g_rank], sizeof(g_sh->error[g_rank]), fmt, ap);
  va_end(ap);
  _exit(2);
}

#define CK(call)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) fail("%s: %s (line %d)", #call, cudaGetErrorString(e_), __LINE__); \
  } while (0)

#define CKD(call)                                                                 \
  do {                                                                            \
    CUresult r_ = (call);                                                         \
    if (r_ != CUDA_SUCCESS) fail("%s: CUresult %d (line %d)", #call, (int)r_, __LINE__); \
  } while (0)

void spin_until(const std::atomic<uint64_t>& v, uint64_t at_least, const char* what) {
  while (v.load(std::memory_order_acquire) < at_least) {
    if (now_s() > g_sh->deadline) fail("deadline passed waiting for %s", what);
  }
}

void barrier(int use, int n) {
  g_sh->arrived[use].fetch_add(1);
  while (g_sh->arrived[use].load() < n) {
    if (now_s() > g_sh->deadline) fail("deadline passed in barrier %d", use);
  }
}

// The driver's stream memory operations, through the runtime's entry point lookup so that the
// probe links the runtime only (as the library does).
using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WriteValueFn g_write_value = nullptr;
WaitValueFn g_wait_value = nullptr;

void load_mem_ops() {
  cudaDriverEntryPointQueryResult q;
  void* fn = nullptr;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) fail("cuStreamWriteValue32 not found");
  g_write_value = reinterpret_cast<WriteValueFn>(fn);
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) fail("cuStreamWaitValue32 not found");
  g_wait_value = reinterpret_cast<WaitValueFn>(fn);
}

struct Ptrs {
  const float* in[kMaxRanks];
  float* out[kMaxRanks];
};

// out[k][i] = in[0][i] + in[1][i] + ... in rank order, for each of `nout` outputs. float4 over
// the bulk (sizes are multiples of 16 bytes here).
__global__ void reduce_kernel(Ptrs p, int nin, int nout, size_t n4) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
       i += (size_t)gridDim.x * blockDim.x) {
    float4 acc = reinterpret_cast<const float4*>(p.in[0])[i];
    for (int r = 1; r < nin; ++r) {
      float4 v = reinterpret_cast<const float4*>(p.in[r])[i];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    for (int k = 0; k < nout; ++k) reinterpret_cast<float4*>(p.out[k])[i] = acc;
  }
}

// spin: signal and wait as kernels. The wait gives up after ~`budget` clock cycles and records
// that it did in *gave_up (so that a deadlock shows as a count, not a hung GPU).
__global__ void spin_signal(volatile uint32_t* flag, uint32_t v) {
  __threadfence_system();
  *flag = v;
}
__global__ void spin_wait(volatile uint32_t* const* flags, int n, int self, uint32_t v,
                          long long budget, unsigned* gave_up) {
  long long start = clock64();
  for (int r = 0; r < n; ++r) {
    if (r == self) continue;
    while (flags[r][0] < v) {
      if (clock64() - start > budget) {
        atomicAdd(gave_up, 1u);
        return;
      }
    }
  }
  __threadfence_system();
}

// A kernel that runs for about `cycles` clock cycles (wait-return's long op).
__global__ void busy_kernel(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void fill_kernel(float* x, size_t n, int rank) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = float(rank + 1) + float(i % 7);
}

enum class Mech { kHost, kEvent, kMemDev, kMemHost, kLeader, kSpin };

struct Candidate {
  const char* name;
  Mech mech;
};
const Candidate kCandidates[] = {
    {"host", Mech::kHost},       {"ipc-event", Mech::kEvent}, {"mem-dev", Mech::kMemDev},
    {"mem-host", Mech::kMemHost}, {"leader", Mech::kLeader},  {"spin", Mech::kSpin},
};

int grid_for(size_t n4, int sms) {
  size_t blocks = (n4 + 511) / 512;
  size_t cap = (size_t)sms * 4;
  return (int)(blocks < cap ? (blocks ? blocks : 1) : cap);
}

// One rank of one candidate at one world size, over every size.
void run_rank(const Candidate& c, int rank, int n, const std::vector<size_t>& sizes, int iters_cap,
              int size_index) {
  g_rank = rank;
  CK(cudaSetDevice(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const bool mem_ops = c.mech == Mech::kMemDev || c.mech == Mech::kMemHost || c.mech == Mech::kLeader;
  if (mem_ops) load_mem_ops();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const size_t bytes = sizes[size_index];
  const size_t count = bytes / sizeof(float);
  const size_t n4 = count / 4;
  float *in, *out, *stage, *out_stage;
  uint32_t* flags;  // [0]: this rank's op counter (mem-dev, leader, spin); [16]: spin's gave_up
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMalloc(&stage, 2 * bytes));
  CK(cudaMalloc(&out_stage, 2 * bytes));
  CK(cudaMalloc(&flags, 4096));
  CK(cudaMemset(flags, 0, 4096));
  CK(cudaMemset(out, 0, bytes));
  fill_kernel<<<grid_for(count / 4, sms), 512, 0, s>>>(in, count, rank);
  CK(cudaStreamSynchronize(s));
  CK(cudaIpcGetMemHandle(&g_sh->stage[rank], stage));
  CK(cudaIpcGetMemHandle(&g_sh->flags[rank], flags));
  CK(cudaIpcGetMemHandle(&g_sh->out_stage[rank], out_stage));
  std::vector<cudaEvent_t> events(kEvents);
  if (c.mech == Mech::kEvent) {
    for (int k = 0; k < kEvents; ++k) {
      CK(cudaEventCreateWithFlags(&events[k], cudaEventDisableTiming | cudaEventInterprocess));
      CK(cudaIpcGetEventHandle(&g_sh->events[rank][k], events[k]));
    }
  }
  uint32_t* host_flags_dev = nullptr;
  if (c.mech == Mech::kMemHost) {
    // Every rank registers the whole shared mapping (page-aligned; each process on its own).
    CK(cudaHostRegister(g_sh, sizeof(Shared), cudaHostRegisterMapped));
    char* base = nullptr;
    CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&base), g_sh, 0));
    host_flags_dev = reinterpret_cast<uint32_t*>(base + offsetof(Shared, host_flags));
  }
  barrier(0, n);

  float* peer_stage[kMaxRanks];
  float* peer_out_stage[kMaxRanks];
  uint32_t* peer_flags[kMaxRanks];
  std::vector<std::vector<cudaEvent_t>> peer_events(n);
  for (int p = 0; p < n; ++p) {
    if (p == rank) {
      peer_stage[p] = stage;
      peer_out_stage[p] = out_stage;
      peer_flags[p] = flags;
      continue;
    }
    void* ptr;
    CK(cudaIpcOpenMemHandle(&ptr, g_sh->stage[p], cudaIpcMemLazyEnablePeerAccess));
    peer_stage[p] = static_cast<float*>(ptr);
    CK(cudaIpcOpenMemHandle(&ptr, g_sh->flags[p], cudaIpcMemLazyEnablePeerAccess));
    peer_flags[p] = static_cast<uint32_t*>(ptr);
    CK(cudaIpcOpenMemHandle(&ptr, g_sh->out_stage[p], cudaIpcMemLazyEnablePeerAccess));
    peer_out_stage[p] = static_cast<float*>(ptr);
    if (c.mech == Mech::kEvent) {
      peer_events[p].resize(kEvents);
      for (int k = 0; k < kEvents; ++k)
        CK(cudaIpcOpenEventHandle(&peer_events[p][k], g_sh->events[p][k]));
    }
  }
  volatile uint32_t** spin_flags = nullptr;
  if (c.mech == Mech::kSpin) {
    CK(cudaMalloc(&spin_flags, sizeof(uint32_t*) * kMaxRanks));
    CK(cudaMemcpy(spin_flags, peer_flags, sizeof(uint32_t*) * n, cudaMemcpyHostToDevice));
  }

  auto dev_flag = [&](int p) {
    return c.mech == Mech::kMemHost ? reinterpret_cast<CUdeviceptr>(host_flags_dev + p * 16)
                                    : reinterpret_cast<CUdeviceptr>(peer_flags[p]);
  };
  auto signal = [&](uint64_t op) {
    switch (c.mech) {
      case Mech::kHost:
        CK(cudaStreamSynchronize(s));
        g_sh->seq[rank].store(op, std::memory_order_release);
        break;
      case Mech::kEvent: {
        // The event about to be recorded again must have been waited on by every peer.
        for (int p = 0; p < n; ++p)
          if (p != rank && op > (uint64_t)kEvents) spin_until(g_sh->waited[p][rank], op - kEvents, "event reuse");
        CK(cudaEventRecord(events[op % kEvents], s));
        g_sh->seq[rank].store(op, std::memory_order_release);
        break;
      }
      case Mech::kMemDev:
      case Mech::kMemHost:
      case Mech::kLeader:
        CKD(g_write_value(s, dev_flag(rank), (cuuint32_t)op, CU_STREAM_WRITE_VALUE_DEFAULT));
        break;
      case Mech::kSpin:
        spin_signal<<<1, 1, 0, s>>>(flags, (uint32_t)op);
        break;
    }
  };
  // Waits for op `op` of every rank in `from` (all peers, or one).
  auto wait_for = [&](uint64_t op, int only) {
    if (c.mech == Mech::kSpin) {
      spin_wait<<<1, 1, 0, s>>>(spin_flags, n, rank, (uint32_t)op, 200000000LL, (unsigned*)(flags + 16));
      return;
    }
    for (int p = 0; p < n; ++p) {
      if (p == rank || (only >= 0 && p != only)) continue;
      switch (c.mech) {
        case Mech::kHost:
          spin_until(g_sh->seq[p], op, "a peer's host counter");
          break;
        case Mech::kEvent:
          spin_until(g_sh->seq[p], op, "a peer's event record");
          CK(cudaStreamWaitEvent(s, peer_events[p][op % kEvents], 0));
          g_sh->waited[rank][p].store(op, std::memory_order_release);
          break;
        default:
          CKD(g_wait_value(s, dev_flag(p), (cuuint32_t)op, CU_STREAM_WAIT_VALUE_GEQ));
      }
    }
  };

  auto one_op = [&](uint64_t op) {
    const size_t slot = op & 1;
    Ptrs ptrs{};
    for (int p = 0; p < n; ++p) ptrs.in[p] = peer_stage[p] + slot * count;
    if (c.mech == Mech::kLeader) {
      if (rank == 0) {
        ptrs.in[0] = in;  // the leader's own input is read where it is
        wait_for(op, -1);
        ptrs.out[0] = out;
        for (int p = 1; p < n; ++p) ptrs.out[p] = peer_out_stage[p] + slot * count;
        reduce_kernel<<<grid_for(n4, sms), 512, 0, s>>>(ptrs, n, n, n4);
        signal(op);
      } else {
        CK(cudaMemcpyAsync(stage + slot * count, in, bytes, cudaMemcpyDeviceToDevice, s));
        signal(op);
        wait_for(op, 0);
        CK(cudaMemcpyAsync(out, out_stage + slot * count, bytes, cudaMemcpyDeviceToDevice, s));
      }
      return;
    }
    CK(cudaMemcpyAsync(stage + slot * count, in, bytes, cudaMemcpyDeviceToDevice, s));
    signal(op);
    wait_for(op, -1);
    ptrs.out[0] = out;
    reduce_kernel<<<grid_for(n4, sms), 512, 0, s>>>(ptrs, n, 1, n4);
  };

  // Ops are numbered from 1 (the counters start at 0).
  int iters = (int)std::min<size_t>(iters_cap, std::max<size_t>(10, (size_t(1) << 31) / bytes));
  if (c.mech == Mech::kSpin) iters = std::min(iters, 20);
  if (c.mech == Mech::kHost) iters = std::min(iters, 500);
  const int warm = std::max(2, iters / 10);
  uint64_t op = 0;
  for (int i = 0; i < warm; ++i) one_op(++op);
  CK(cudaStreamSynchronize(s));
  barrier(1, n);
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) one_op(++op);
  const double t_enq = now_s();
  CK(cudaStreamSynchronize(s));
  const double t1 = now_s();
  barrier(2, n);
  g_sh->op_us[rank] = (t1 - t0) * 1e6 / iters;
  g_sh->enqueue_us[rank] = (t_enq - t0) * 1e6 / iters;

  std::vector<float> host(count);
  CK(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost));
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int p = 0; p < n; ++p) want += float(p + 1) + float(i % 7);
    if (host[i] != want) ++wrong;
  }
  if (c.mech == Mech::kSpin) {
    unsigned gave_up = 0;
    CK(cudaMemcpy(&gave_up, flags + 16, sizeof(gave_up), cudaMemcpyDeviceToHost));
    if (gave_up) snprintf(g_sh->error[rank], 256, "%u spin waits gave up (deadlock broken by their deadline)", gave_up);
  }
  g_sh->wrong[rank] = wrong;
  barrier(3, n);  // no rank frees what a peer still maps
  _exit(0);
}

// The reduction kernel alone, in one process: n inputs into one output, as a one-shot rank runs
// it, plus the staging copy.
void run_kernel_alone(int n, size_t bytes, double* kernel_us, double* copy_us) {
  g_rank = 0;
  CK(cudaSetDevice(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t count = bytes / sizeof(float), n4 = count / 4;
  std::vector<float*> bufs(n + 1);
  for (auto& b : bufs) CK(cudaMalloc(&b, bytes));
  Ptrs p{};
  for (int r = 0; r < n; ++r) p.in[r] = bufs[r];
  p.out[0] = bufs[n];
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int iters = (int)std::min<size_t>(1000, std::max<size_t>(10, (size_t(1) << 31) / bytes));
  for (int i = 0; i < 3; ++i) reduce_kernel<<<grid_for(n4, sms), 512, 0, s>>>(p, n, 1, n4);
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) reduce_kernel<<<grid_for(n4, sms), 512, 0, s>>>(p, n, 1, n4);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  *kernel_us = ms * 1e3 / iters;
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) CK(cudaMemcpyAsync(bufs[1], bufs[0], bytes, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  CK(cudaEventElapsedTime(&ms, a, b));
  *copy_us = ms * 1e3 / iters;
}

// A stream-ordered wait: while a ~20 ms kernel runs on one stream, how long the host takes to
// record an event behind it and make another stream wait on that event (and that the waiting
// stream really waited).
void run_wait_return(double* host_us, double* waited_ms) {
  g_rank = 0;
  CK(cudaSetDevice(0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  cudaStream_t comm, caller;
  CK(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  cudaEvent_t done, a, b;
  CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  busy_kernel<<<1, 1, 0, comm>>>(1);
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(a, caller));
  busy_kernel<<<1, 1, 0, comm>>>((long long)clock_khz * 20);  // ~20 ms
  const double t0 = now_s();
  CK(cudaEventRecord(done, comm));
  CK(cudaStreamWaitEvent(caller, done, 0));
  const double t1 = now_s();
  CK(cudaEventRecord(b, caller));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  *host_us = (t1 - t0) * 1e6;
  *waited_ms = ms;
}

std::vector<size_t> parse_sizes(const char* s) {
  std::vector<size_t> out;
  std::string str(s);
  size_t pos = 0;
  while (pos < str.size()) {
    size_t comma = str.find(',', pos);
    std::string tok = str.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end;
    double v = strtod(tok.c_str(), &end);
    size_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024;
    if (*end == 'M' || *end == 'm') mult = 1024 * 1024;
    if (*end == 'G' || *end == 'g') mult = 1024ull * 1024 * 1024;
    size_t b = (size_t)(v * mult);
    if (b < 16 || b % 16) {
      fprintf(stderr, "gpu_probe: size '%s' must be a multiple of 16 bytes\n", tok.c_str());
      exit(2);
    }
    out.push_back(b);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string human(size_t b) {
  char buf[32];
  if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, sizeof buf, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) snprintf(buf, sizeof buf, "%zuK", b >> 10);
  else snprintf(buf, sizeof buf, "%zu", b);
  return buf;
}

// Forks `n` children running `body(rank)`, waits for them until the deadline, kills them past it.
// Returns "" or what went wrong.
template <class Body>
std::string run_forked(int n, double timeout_s, Body body) {
  memset(static_cast<void*>(g_sh), 0, sizeof(Shared));
  g_sh->deadline = now_s() + timeout_s;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      body(r);
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::string why;
  int left = n;
  std::vector<bool> done(n, false);
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && why.empty()) {
          why = g_sh->error[r][0] ? std::string("rank ") + std::to_string(r) + ": " + g_sh->error[r]
                                  : std::string("rank ") + std::to_string(r) + " died";
        }
      }
    }
    if (left > 0 && now_s() > g_sh->deadline + 5) {
      for (int r = 0; r < n; ++r)
        if (!done[r]) kill(pids[r], SIGKILL);
      for (int r = 0; r < n; ++r)
        if (!done[r]) waitpid(pids[r], nullptr, 0);
      return why.empty() ? "hung: killed after " + std::to_string((int)timeout_s) + " s" : why;
    }
    usleep(1000);
  }
  return why;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4};
  std::vector<size_t> sizes = parse_sizes("8K,256K,8M,256M");
  int iters = 2000;
  double timeout = 30;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "gpu_probe: %s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") {
      ranks.clear();
      std::string s = next();
      size_t pos = 0;
      while (pos <= s.size()) {
        size_t c = s.find(',', pos);
        ranks.push_back(atoi(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos).c_str()));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    } else if (a == "--sizes") {
      sizes = parse_sizes(next());
    } else if (a == "--iters") {
      iters = atoi(next());
    } else if (a == "--timeout") {
      timeout = atof(next());
    } else if (a == "--only") {
      only = std::string(",") + next() + ",";
    } else {
      fprintf(stderr,
              "usage: gpu_probe [--ranks 2,4] [--sizes 8K,256K,8M,256M] [--iters N] [--timeout S] "
              "[--only host,ipc-event,mem-dev,mem-host,leader,spin,wait-return,kernel]\n");
      return 2;
    }
  }
  for (int n : ranks)
    if (n < 2 || n > kMaxRanks) {
      fprintf(stderr, "gpu_probe: --ranks: each between 2 and %d\n", kMaxRanks);
      return 2;
    }
  auto wanted = [&](const char* name) {
    return only.empty() || only.find(std::string(",") + name + ",") != std::string::npos;
  };
  g_sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (g_sh == MAP_FAILED) {
    perror("gpu_probe: mmap");
    return 1;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  printf("# gpu_probe: one-shot all-reduce, float32 sum, each rank a process of its own on GPU 0\n");
  printf("# us/op: wall time of the timed ops / their count, max over ranks; enq: host time to enqueue"
         " one op (the host waits inside it for host and ipc-event)\n");
  printf("%-12s %5s %7s %10s %9s %7s  %s\n", "candidate", "ranks", "size", "us/op", "enq_us", "wrong", "note");

  if (wanted("wait-return")) {
    std::string why = run_forked(1, timeout, [&](int) {
      double host_us = 0, waited_ms = 0;
      run_wait_return(&host_us, &waited_ms);
      g_sh->op_us[0] = host_us;
      g_sh->enqueue_us[0] = waited_ms;
    });
    if (why.empty())
      printf("%-12s %5d %7s %10.1f %9s %7s  host time for event record + cudaStreamWaitEvent while a "
             "20 ms kernel runs; the caller's stream then waited %.1f ms\n",
             "wait-return", 1, "-", g_sh->op_us[0], "-", "-", g_sh->enqueue_us[0]);
    else
      printf("%-12s %5d %7s %10s %9s %7s  %s\n", "wait-return", 1, "-", "-", "-", "-", why.c_str());
  }
  if (wanted("kernel")) {
    for (int n : ranks)
      for (size_t b : sizes) {
        std::string why = run_forked(1, timeout, [&](int) {
          double k = 0, cp = 0;
          run_kernel_alone(n, b, &k, &cp);
          g_sh->op_us[0] = k;
          g_sh->enqueue_us[0] = cp;
        });
        if (why.empty())
          printf("%-12s %5d %7s %10.1f %9s %7s  the reduction of %d inputs alone (one process);"
                 " a staging copy: %.1f us\n",
                 "kernel", n, human(b).c_str(), g_sh->op_us[0], "-", "-", n, g_sh->enqueue_us[0]);
        else
          printf("%-12s %5d %7s %10s %9s %7s  %s\n", "kernel", n, human(b).c_str(), "-", "-", "-", why.c_str());
      }
  }
  for (const Candidate& c : kCandidates) {
    if (!wanted(c.name)) continue;
    for (int n : ranks)
      for (size_t si = 0; si < sizes.size(); ++si) {
        if (c.mech == Mech::kSpin && si > 0) break;  // its latency alone is the question
        std::string why = run_forked(n, timeout, [&](int r) { run_rank(c, r, n, sizes, iters, (int)si); });
        double op_us = 0, enq = 0;
        long wrong = 0;
        std::string note;
        for (int r = 0; r < n; ++r) {
          op_us = std::max(op_us, g_sh->op_us[r]);
          enq = std::max(enq, g_sh->enqueue_us[r]);
          wrong += g_sh->wrong[r];
          if (note.empty() && g_sh->error[r][0]) note = g_sh->error[r];
        }
        if (!why.empty())
          printf("%-12s %5d %7s %10s %9s %7s  %s\n", c.name, n, human(sizes[si]).c_str(), "-", "-", "-",
                 why.c_str());
        else
          printf("%-12s %5d %7s %10.1f %9.1f %7ld  %s\n", c.name, n, human(sizes[si]).c_str(), op_us, enq,
                 wrong, note.c_str());
      }
  }
  return 0;
}
