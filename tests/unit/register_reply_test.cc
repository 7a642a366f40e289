// The registration reply's size bound (daemon/control/register_reply.h), counted without
// building the reply, against the size of the reply actually built: never below it (a set is
// refused before it is committed when the bound passes the frame limit), and close above it.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "daemon/control/register_reply.h"
#include "shared/channel_layout.h"

namespace gradsync {
namespace {

size_t built(const plan::Plan& plan, bool zero_copy, bool events) {
  control::Reply reply;
  reply.set_id(~uint64_t{0});
  reply.set_fd_count(~uint32_t{0});
  fill_register_buckets(plan, [zero_copy](size_t) { return zero_copy; }, reply.mutable_register_());
  if (events) {
    for (uint32_t i = 0; i < kDeviceEventsPerDirection; ++i) {
      reply.mutable_register_()->add_ready_events(std::string(64, 'r'));
      reply.mutable_register_()->add_done_events(std::string(64, 'd'));
    }
  }
  return reply.ByteSizeLong();
}

TEST_CASE("register reply: the counted bound is never below the built reply, and close to it", "[register_reply]") {
  const std::vector<std::string> groups = {"dp", "a-group-name-of-some-length", std::string(200, 'g')};
  for (const uint64_t cap : {uint64_t{1}, uint64_t{4096}, plan::kDefaultBucketCapBytes}) {
    for (const size_t count : {size_t{1}, size_t{300}, size_t{70'000}}) {
      std::vector<plan::TensorLayout> layout;
      for (size_t i = 0; i < count; ++i) {
        plan::TensorLayout t;
        t.dtype = i % 3 == 0 ? DType::kFloat16 : (i % 3 == 1 ? DType::kFloat32 : DType::kInt64);
        t.numel = 1 + i % 1000;
        t.group = groups[i % groups.size()];
        layout.push_back(t);
      }
      const plan::Plan plan = plan::plan_buckets(layout, plan::PlanOptions{cap});
      INFO("cap " << cap << ", " << count << " tensors, " << plan.buckets.size() << " buckets");
      const size_t bound = register_reply_bound(plan);
      for (bool zero_copy : {false, true}) {
        for (bool events : {false, true}) {
          CHECK(built(plan, zero_copy, events) <= bound);
        }
      }
      // Only the flags and ids a reply may leave out separate them.
      CHECK(bound - built(plan, true, true) <= 32);
    }
  }
}

}  // namespace
}  // namespace gradsync
