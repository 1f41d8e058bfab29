// What crosses a TCP connection between two ranks, and the checks applied to it before any
// buffer is touched. Pure functions over bytes: the fuzz tests call them directly.
//
// A connection starts with a Hello each way (the connecting rank's first, then the accepting
// rank's answer). A Hello carries the job's secret (drawn by rank 0, shared through the store),
// the group it belongs to (a hash of the group's store prefix), the sender's rank and which of the
// pair's sockets this is. Anything that is not a valid Hello for this group is dropped and logged.
//
// After the Hellos, each side sends frames: an 8-byte FrameHead (type, body length), then the
// body. A Data body is a MsgHeader followed by its payload; Abort carries the reason a rank
// aborted the group; Bye says the rank shut its group down cleanly (an end of stream without it
// means the peer died). Query asks the peer where it stands, and State is its answer: a rank that
// timed out follows the chain of waits with them (see follow_waits in transport.h). Lengths are
// checked against the slot size before a byte of the body is read, so a corrupt or hostile peer
// cannot steer a read past a buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace ringreduce {
namespace tcp {

constexpr size_t kSecretBytes = 16;
constexpr uint64_t kHelloMagic = 0x314f4c4c45485252ULL;  // "RRHELLO1"
constexpr uint32_t kWireVersion = 1;
constexpr size_t kMaxReasonBytes = 2048;

struct Hello {
  uint64_t magic = kHelloMagic;
  uint32_t version = kWireVersion;
  int32_t rank = -1;
  int32_t world = 0;
  uint32_t socket = 0;   // which of the pair's sockets
  uint32_t sockets = 0;  // sockets per pair
  uint32_t reserved = 0;
  uint64_t group = 0;    // group_id() of the group's store prefix
  uint64_t slot_bytes = 0;
  uint8_t secret[kSecretBytes] = {};
};
static_assert(sizeof(Hello) == 64, "Hello is a wire format");

enum class FrameType : uint32_t { Data = 1, Abort = 2, Bye = 3, Query = 4, State = 5 };

// The body of a State frame.
struct StateBody {
  uint64_t op_seq = 0;      // PeerState::op_seq
  int32_t blocked_on = -1;  // PeerState::blocked_on
  uint32_t reserved = 0;
};
static_assert(sizeof(StateBody) == 16, "StateBody is a wire format");

struct FrameHead {
  uint32_t type = 0;  // FrameType
  uint32_t len = 0;   // body bytes that follow
};
static_assert(sizeof(FrameHead) == 8, "FrameHead is a wire format");

// What a Hello must say to be accepted.
struct HelloExpect {
  int world = 0;
  uint32_t sockets = 0;
  uint64_t group = 0;
  uint64_t slot_bytes = 0;
  uint8_t secret[kSecretBytes] = {};
};

// A stable 64-bit id of a group (FNV-1a of its store prefix).
uint64_t group_id(const std::string& prefix);

// Checks `n` bytes received as a Hello; fills *out and returns "" when it is one this group
// accepts, otherwise says why not (without echoing the secret).
std::string check_hello(const void* bytes, size_t n, const HelloExpect& expect, Hello* out);

// Checks a frame head; returns "" if a body of head.len bytes of that type may be read with
// slots of `slot_bytes`, otherwise why not.
std::string check_frame_head(const FrameHead& head, size_t slot_bytes);

// Checks a State body from a group of `world` ranks; "" if it may be believed.
std::string check_state_body(const StateBody& body, int world);

// Checks the MsgHeader that opens a Data body of `len` bytes; "" if its payload length agrees.
std::string check_data_header(const MsgHeader& hdr, uint32_t len);

}  // namespace tcp
}  // namespace ringreduce
