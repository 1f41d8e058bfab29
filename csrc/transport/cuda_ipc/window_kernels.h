// The device window's ordering kernels (device_window.h): the layout of a window's control page
// and the two single-thread kernels that post to the peers and admit a turn. Raw pointers only.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace ringreduce {
namespace window {

constexpr int kMaxRanks = 64;
// The control page: one line per counter, as peers write them at once.
constexpr size_t kLine = 64;
constexpr size_t kSemOffset = 0;                        // + p * kLine: peer p's posts, not yet admitted
constexpr size_t kAbortOffset = kMaxRanks * kLine;      // nonzero: write nothing more
constexpr size_t kTurnOffset = kAbortOffset + kLine;    // turns admitted so far
constexpr size_t kPrintOffset = kTurnOffset + kLine;    // + (turn & 1) * kLine: the turn's Print
constexpr size_t kControlBytes = 8192;
static_assert(kPrintOffset + 2 * kLine <= kControlBytes, "the control page holds its lines");

// What a rank's call of the op was, posted with each turn and compared by every peer: the element
// count and (dtype << 8 | op) must agree; `tag` (the rank's op number) only names it in an error.
struct Print {
  uint64_t count;
  uint32_t meta;
  uint32_t tag;
};

// The first disagreement a rank's admit saw, in host memory mapped for the device (its flag is
// set last). Read by the host's watchdog.
struct Mismatch {
  uint32_t flag;
  int32_t peer;
  Print mine;
  Print theirs;
};

// Every rank's window base as this process addresses it (own included).
struct Bases {
  uint8_t* base[kMaxRanks];
};

// One thread, queued on `s`: writes `print` into this rank's line for the current turn, then
// (after a system-wide fence: what the stream wrote before, the staged input, is visible first)
// adds one to this rank's semaphore in every peer's page.
void post(const Bases& b, int rank, int size, Print print, CUstream_st* s);
// One thread, queued on `s` after the waits for every peer's post: takes one post of each peer,
// compares each peer's Print of this turn with this rank's (a disagreement is written to
// `mismatch` and sets the abort word, so nothing of the turn is written), and advances the turn.
void admit(const Bases& b, int rank, int size, Mismatch* mismatch, CUstream_st* s);

}  // namespace window
}  // namespace ringreduce
