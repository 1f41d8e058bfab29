// The knobs, read from the environment in one place (documented in README.md, "Knobs").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringreduce {

class Bootstrap;

struct Config {
  // Payload of one message = the slice the ring pipelines. Measured on the development machine
  // (2 cores): see README.md for the sweep that chose it.
  size_t slice_bytes = 128 << 10;
  // Slots per link: how many slices a rank may be ahead of its successor.
  uint32_t slots = 4;
  // How long a waiting rank spins before it sleeps on a futex.
  std::chrono::microseconds spin{50};

  // Defaults overridden by RINGREDUCE_SLICE_BYTES, RINGREDUCE_SLOTS, RINGREDUCE_SPIN_US.
  // Throws ringreduce::Error naming the variable when a value does not parse or is out of range.
  static Config from_env();

  // Every rank must slice the same way, so rank 0's values win: rank 0 publishes its config
  // through the store and the others adopt it (returning what they adopted).
  Config agree(Bootstrap& bs, int rank) const;

  std::string to_string() const;
};

}  // namespace ringreduce
