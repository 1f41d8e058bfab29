// Named points where a test makes a rank die, so that a fault lands in a chosen phase of an
// algorithm instead of wherever a timer happens to catch it.
//
// RINGREDUCE_FAILPOINT=<name>:<rank>[:<nth>[:stop]] makes group rank <rank> kill itself (SIGKILL,
// as the OOM killer would) the <nth> time (1 by default) it reaches failpoint(<name>); with
// `stop`, stop itself instead (SIGSTOP, as a debugger or a paused container would), so that a
// test resumes it once its peers have given up. Unset, a failpoint costs one load of a flag.
// For tests only: docs/knobs.md lists the names.
#pragma once

namespace ringreduce {

// `name` must be a string literal; `rank` the calling rank in the whole group.
void failpoint(const char* name, int rank);

}  // namespace ringreduce
