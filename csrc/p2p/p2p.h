// Point-to-point sends and receives with tags, beside the ring.
//
// Collectives can match messages by position because every rank issues a group's collectives in
// the same order. Sends and receives have no such order: a rank may post receives for tags 2 then
// 1 while its peer sends 1 then 2, receive from any source, or leave sends unmatched for a while.
// So they run on a transport of their own (the collectives' FIFOs never carry them) and through a
// rendezvous, as gloo's pairs do:
//
//   sender                          receiver
//   Ready(seq, bytes, tag)   --->   matched against posted receives (source, tag; in post order)
//                            <---   Clear(seq, its bytes)   once a receive matches
//   Data(seq, offset) ...    --->   copied straight into the receive's buffer
//
// Nothing is buffered on the receiver's side, and a receiver never has to wait on one peer to
// take a message from another: every message is handled as it arrives (a Ready is remembered,
// data lands in a buffer that a Clear already promised). A single engine thread per group serves
// every peer with the transport's non-blocking calls and sleeps on its doorbell when idle. The
// thread starts with the first send or receive, so groups that never use them pay nothing.
//
// Sizes and dtypes of a matched pair are compared at the Clear: a mismatch fails both sides, on
// both ranks, saying what differed. Every request has a deadline. One that expires before it is
// matched fails alone: a send given up is withdrawn with Cancel (a receive it had matched in the
// meantime waits for another send), and a receiver that shuts down answers the Readies it still
// holds with Refuse. One that expires halfway
// through its data means a peer stopped mid-message: the channel is aborted, on every rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "transport/transport.h"

namespace ringreduce {

class P2p {
 public:
  // Called once per request, on the engine thread: null error on success, and the rank the data
  // came from (the peer for a send).
  using Done = std::function<void(std::exception_ptr error, int source)>;
  // Names a dtype code for error messages (the codes themselves are the caller's business).
  using DtypeName = std::string (*)(uint8_t);

  // `transport` is this engine's alone, with doorbells on.
  P2p(Transport& transport, DtypeName dtype_name);
  ~P2p();  // shutdown()
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // `data` must stay valid and unmodified (send) or untouched by others (recv) until `done` ran.
  // Throws if the engine was shut down; every other failure arrives through `done`.
  void send(const void* data, size_t bytes, uint8_t dtype, int peer, int tag,
            std::chrono::milliseconds timeout, Done done);
  // `peer` -1 receives from any source.
  void recv(void* data, size_t bytes, uint8_t dtype, int peer, int tag,
            std::chrono::milliseconds timeout, Done done);

  // Stops taking requests. Transfers already matched finish (each within its deadline); requests
  // still unmatched fail, and peers' sends this rank held unmatched are refused. Joins the thread.
  void shutdown();
  // Fails every request now with `why` and aborts the channel on every rank. Joins the thread.
  void cancel(const std::string& why);

 private:
  struct Request;
  using Req = std::shared_ptr<Request>;
  struct Ready {  // a peer's send waiting for a receive here
    int src;
    uint64_t seq;
    uint64_t bytes;
    int tag;
    uint8_t dtype;
    uint64_t arrival;
  };
  struct Control {
    OpKind kind;
    uint64_t seq;
    uint64_t count;
    int tag;
    uint8_t dtype;
  };
  struct Peer {
    uint64_t next_seq = 0;                 // sender-side number of our next send to this peer
    std::deque<Control> control;           // control messages waiting for a slot
    std::map<uint64_t, Req> awaiting_clear;  // our sends told to the peer, not yet matched
    std::deque<Req> streaming;             // our matched sends, in the order the peer cleared them
    std::deque<Req> incoming;              // our receives matched to this peer's sends, in order
    std::deque<Ready> unmatched;           // this peer's sends with no receive here yet
  };

  // Hands a new request to the engine (or fails it at once if the channel is broken).
  void submit(bool is_send, uint8_t* data, size_t bytes, uint8_t dtype, int peer, int tag,
              std::chrono::milliseconds timeout, Done done);
  void start_locked();
  void run();
  // One pass over everything; true if anything moved.
  bool step();
  void take_new_requests();
  void post_recv(const Req& r);
  void grant(const Req& r, const Ready& ready);
  bool drain_peer(int p);
  bool feed_peer(int p);
  void on_message(int p, const MsgHeader& h, const void* payload);
  bool check_deadlines();  // true if it failed anything
  // Fails what waits on a peer whose process died (at most every kMaxIdle); true if it failed
  // anything. A transfer cut off halfway breaks the channel, as a stuck one does.
  bool check_peers();
  void finish(const Req& r, std::exception_ptr error);
  void fail_all(const std::string& why);
  std::chrono::nanoseconds next_wake() const;
  // The peer this rank's oldest waiting request waits for (-1: none), published through the
  // transport (note_state) whenever it changes, so that a peer whose request to this rank times
  // out can see whom this one waits for in turn.
  int waiting_for() const;
  void note_waiting();
  // For a request to or from `peer` that timed out: where the chain of waits from `peer` ends
  // (": rank 2 waits for rank 1, which is stopped ..."), asked of the peers before `walk`; "" when
  // `peer` itself holds it up (it waits for nobody, or its state cannot be learned).
  std::string held_up_by(int peer, const Deadline& walk);
  bool busy() const;  // a matched transfer is in flight
  std::string describe(const Request& r) const;

  Transport& t_;
  DtypeName dtype_name_;
  const int rank_;
  const int size_;

  std::mutex mu_;  // guards the members up to thread_
  std::deque<Req> new_requests_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::string broken_;  // why the channel is unusable, once it is
  std::thread thread_;
  std::mutex join_mu_;

  // Engine thread only.
  std::vector<Peer> peers_;
  std::list<Req> posted_;  // receives not matched yet, in post order
  uint64_t arrivals_ = 0;
  uint64_t posts_ = 0;
  bool draining_ = false;
  Deadline liveness_due_{};  // when check_peers looks next
  int noted_ = -1;           // the peer last published by note_waiting
  uint64_t taken_ = 0;       // requests taken so far (Request::taken)
};

}  // namespace ringreduce
