// The host executor: buckets of sets in host memory (memfds mapped into the daemon).
//
// A node-local bucket is memory-bound work on the reduction pool; it runs inline in launch(),
// on the caller's thread, because handing it to another thread would cost more than the whole
// 4 KiB step. A bucket whose group spans nodes waits on the network, so it runs on the
// executor's own thread, and the worker stays free meanwhile to drain rings, watch its
// deadlines and take a failure.
#pragma once

#include <deque>
#include <thread>

#include "daemon/backend/executor.h"
#include "daemon/backend/host/cross_node.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "shared/mutex.h"

namespace gradsync::host {

class HostExecutor final : public BucketExecutor {
 public:
  HostExecutor(ThreadPool* pool, Logger log, IntegrityCheck integrity = {});
  ~HostExecutor() override;  // finishes the queued buckets (they fail at once after abort)
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  void launch(BucketCall call, BucketDone done) override;
  void abort(const Status& why) override;

 private:
  struct Queued {
    BucketCall call;
    BucketDone done;
  };
  void run();  // the cross-node thread
  Status aborted() const;
  void run_local(const BucketCall& call);

  ThreadPool* pool_;
  Logger log_;
  const IntegrityCheck integrity_;
  std::shared_ptr<NodeBuffers> buffers_;  // cross-node thread only

  mutable Mutex mutex_;
  CondVar wake_;
  std::deque<Queued> queue_ GS_GUARDED_BY(mutex_);
  Status aborted_ GS_GUARDED_BY(mutex_);
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  std::thread thread_;        // started on the first cross-node bucket
};

}  // namespace gradsync::host
