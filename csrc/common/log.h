// What a rank says about itself: RINGREDUCE_DEBUG=WARN|INFO|TRACE, silent when unset (as NCCL_DEBUG).
//
// WARN: one line per failed op (timeouts, desyncs, dead peers, aborts). INFO adds one line per rank
// per group at set-up (versions, rank and world, transport per peer, algorithm crossovers, slot and
// slice sizes). TRACE adds one per op. Lines go to stderr, or to RINGREDUCE_DEBUG_FILE, where %h
// becomes the host name and %p the process id (one file per rank, as NCCL_DEBUG_FILE). Each line
// starts with host:pid:thread [rank] RINGREDUCE <level>, so that several ranks' lines sort apart.
#pragma once

#include <string>

namespace ringreduce::log {

enum class Level { Off = 0, Warn = 1, Info = 2, Trace = 3 };

// The level, read once from the environment (an unknown value is reported once and read as WARN).
Level level();
inline bool enabled(Level l) { return l != Level::Off && static_cast<int>(level()) >= static_cast<int>(l); }

// Writes one line (the message must not end with a newline); `rank` -1 when there is none.
void write(Level l, int rank, const std::string& message);

// Writes one NOTE line whatever RINGREDUCE_DEBUG says, to the same place and in the same shape:
// what a user must see without asking for it (where a flight recorder dump went, a slower path
// the group fell back to, a connection a listener refused).
void note(int rank, const std::string& message);

}  // namespace ringreduce::log
