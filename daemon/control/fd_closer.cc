#include "daemon/control/fd_closer.h"

#include <unistd.h>

#include <chrono>
#include <string>

namespace gradsync {

FdCloser::FdCloser() : thread_([state = state_] { run(state); }) {}

FdCloser::~FdCloser() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  bool drained = false;
  {
    MutexLock lock(state_->mutex);
    state_->stop = true;
    state_->changed.notify_all();
    while (!(state_->queue.empty() && state_->closing == 0)) {
      if (!state_->changed.wait_until(lock, deadline) && std::chrono::steady_clock::now() >= deadline) break;
    }
    drained = state_->queue.empty() && state_->closing == 0;
  }
  if (drained) {
    thread_.join();
  } else {
    thread_.detach();  // it holds the state; the process ends without it
  }
}

void FdCloser::close_later(std::vector<UniqueFd> fds) {
  if (fds.empty()) return;
  MutexLock lock(state_->mutex);
  for (UniqueFd& fd : fds) state_->queue.push_back(std::move(fd));
  state_->changed.notify_all();
}

size_t FdCloser::pending() const {
  MutexLock lock(state_->mutex);
  return state_->queue.size() + state_->closing;
}

void FdCloser::run(const std::shared_ptr<State>& state) {
  MutexLock lock(state->mutex);
  for (;;) {
    while (state->queue.empty() && !state->stop) state->changed.wait(lock);
    if (state->queue.empty()) return;  // stopping, and nothing left
    UniqueFd fd = std::move(state->queue.front());
    state->queue.pop_front();
    ++state->closing;
    {
      MutexUnlock unlocked(state->mutex);
      fd.reset();  // may block: this thread's only job
    }
    --state->closing;
    state->changed.notify_all();
  }
}

bool is_memfd(int fd) {
  char link[64] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = ::readlink(proc.c_str(), link, sizeof(link) - 1);
  return length > 0 && std::string(link, static_cast<size_t>(length)).rfind("/memfd:", 0) == 0;
}

}  // namespace gradsync
