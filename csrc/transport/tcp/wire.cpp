#include "transport/tcp/wire.h"

#include <cstring>

#include "common/error.h"

namespace ringreduce {
namespace tcp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian, as every host ringreduce runs on");

uint64_t group_id(const std::string& prefix) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : prefix) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string check_hello(const void* bytes, size_t n, const HelloExpect& expect, Hello* out) {
  if (n != sizeof(Hello)) {
    return detail::cat("a hello of ", n, " bytes, expected ", sizeof(Hello));
  }
  Hello h;
  std::memcpy(&h, bytes, sizeof h);
  if (h.magic != kHelloMagic) return "not a ringreduce hello (bad magic)";
  if (h.version != kWireVersion) {
    return detail::cat("wire version ", h.version, ", this build speaks ", kWireVersion);
  }
  // Compared in full whatever differs, so the time taken says nothing about the secret.
  unsigned diff = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) diff |= h.secret[i] ^ expect.secret[i];
  if (diff != 0) return "wrong job secret";
  if (h.group != expect.group) return "a hello for another process group";
  if (h.world != expect.world) {
    return detail::cat("world size ", h.world, ", this group has ", expect.world);
  }
  if (h.rank < 0 || h.rank >= expect.world) {
    return detail::cat("rank ", h.rank, " outside the group of ", expect.world);
  }
  if (h.sockets != expect.sockets || h.socket >= h.sockets) {
    return detail::cat("socket ", h.socket, " of ", h.sockets, ", this group uses ", expect.sockets,
                       " per peer");
  }
  if (h.slot_bytes != expect.slot_bytes) {
    return detail::cat("slots of ", h.slot_bytes, " bytes, this group uses ", expect.slot_bytes);
  }
  *out = h;
  return "";
}

std::string check_frame_head(const FrameHead& head, size_t slot_bytes) {
  switch (static_cast<FrameType>(head.type)) {
    case FrameType::Data:
      if (head.len < sizeof(MsgHeader) || head.len - sizeof(MsgHeader) > slot_bytes) {
        return detail::cat("a data frame of ", head.len, " bytes (at least ", sizeof(MsgHeader),
                           ", at most ", sizeof(MsgHeader) + slot_bytes, ")");
      }
      return "";
    case FrameType::Abort:
      if (head.len > kMaxReasonBytes) {
        return detail::cat("an abort frame of ", head.len, " bytes (at most ", kMaxReasonBytes, ")");
      }
      return "";
    case FrameType::Bye:
      if (head.len != 0) return detail::cat("a goodbye frame of ", head.len, " bytes");
      return "";
    case FrameType::Query:
      if (head.len != 0) return detail::cat("a query frame of ", head.len, " bytes");
      return "";
    case FrameType::State:
      if (head.len != sizeof(StateBody)) {
        return detail::cat("a state frame of ", head.len, " bytes (", sizeof(StateBody), " expected)");
      }
      return "";
  }
  return detail::cat("a frame of unknown type ", head.type);
}

std::string check_state_body(const StateBody& body, int world) {
  if (body.blocked_on < -1 || body.blocked_on >= world) {
    return detail::cat("a state that waits for rank ", body.blocked_on, " in a group of ", world);
  }
  return "";
}

std::string check_data_header(const MsgHeader& hdr, uint32_t len) {
  // check_frame_head has refused such frames already; checked again so that this holds alone.
  if (len < sizeof(MsgHeader)) return detail::cat("a data frame of ", len, " bytes, shorter than its header");
  if (hdr.bytes != len - sizeof(MsgHeader)) {
    return detail::cat("a message header that announces ", hdr.bytes, " payload bytes in a frame of ",
                       len - sizeof(MsgHeader));
  }
  return "";
}

}  // namespace tcp
}  // namespace ringreduce
