// Where the descriptors clients sent are finally closed: a thread of its own. The last close of
// a file can block for as long as its sender likes: a TCP socket with SO_LINGER and data its
// peer never reads (the linger time, up to hours), a Unix socket with such a socket queued in
// it (its queue is released with it), a FUSE file (its server's FLUSH). On the io thread that
// would stop every client of the daemon; here it stops only the closes queued behind it.
//
// How it is the last close: a session keeps a duplicate ("keeper") of every descriptor it
// received that is not a memfd (whose close never blocks), and hands the keepers here when it
// ends. Every other copy, closed wherever a request used or refused it, is then not the last.
#pragma once

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "shared/mutex.h"
#include "shared/unique_fd.h"

namespace gradsync {

class FdCloser {
 public:
  FdCloser();
  // Waits up to 2 s for the queue to drain, then leaves the thread to finish on its own (a
  // close stuck for a linger time must not hold up the daemon's exit).
  ~FdCloser();
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

  // Closes them on the closer's thread, in order. Any thread.
  void close_later(std::vector<UniqueFd> fds);

  // Descriptors waiting to be closed (tests, metrics).
  size_t pending() const;

 private:
  struct State {
    mutable Mutex mutex;
    CondVar changed;
    std::deque<UniqueFd> queue GS_GUARDED_BY(mutex);
    size_t closing GS_GUARDED_BY(mutex) = 0;  // taken off the queue, not closed yet
    bool stop GS_GUARDED_BY(mutex) = false;
  };
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_ = std::make_shared<State>();  // shared with the thread
  std::thread thread_;
};

// Whether `fd` is a memfd, from its /proc link alone (which asks no file system anything).
bool is_memfd(int fd);

}  // namespace gradsync
