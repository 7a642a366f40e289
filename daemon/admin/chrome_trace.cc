#include "daemon/admin/chrome_trace.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>

#include "daemon/util/safe_text.h"

namespace gradsync::admin {
namespace {

using Clock = std::chrono::steady_clock;

class Writer {
 public:
  explicit Writer(Clock::time_point base) : base_(base) {}

  void metadata(int pid, int tid, const char* what, const std::string& name) {
    begin();
    out_ += "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"name\":\"" +
            what + "\",\"args\":{\"name\":" + json_string(name) + "}}";
  }
  void sort_index(int pid, int tid, int index) {
    begin();
    out_ += "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
            ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(index) + "}}";
  }
  // A complete slice; `args` is a JSON object's members ("\"a\":1,\"b\":2") or empty.
  void slice(int pid, int tid, const std::string& name, Clock::time_point from, Clock::time_point to,
             const std::string& args = {}) {
    if (to < from) to = from;
    begin();
    out_ += "{\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
            ",\"name\":" + json_string(name) + ",\"ts\":" + micros(from - base_) + ",\"dur\":" + micros(to - from);
    if (!args.empty()) out_ += ",\"args\":{" + args + "}";
    out_ += "}";
  }
  std::string finish() { return "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[" + out_ + "\n]}\n"; }

  static std::string micros(Clock::duration d) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", std::chrono::duration<double, std::micro>(d).count());
    return text;
  }

 private:
  void begin() {
    if (!out_.empty()) out_ += ",";
    out_ += "\n";
  }
  Clock::time_point base_;
  std::string out_;
};

constexpr int kOperationsTrack = 0;
constexpr int kFirstRankTrack = 1;
constexpr int kFirstGroupTrack = 100'000;

}  // namespace

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (const size_t length = c >= 0x80 ? utf8_sequence_length(text, i) : 0; length > 0) {
      out.append(text, i, length);  // valid UTF-8 stays as it is
      i += length;
      continue;
    } else {
      char escaped[8];  // control characters, DEL, and bytes that are not UTF-8 (as Latin-1)
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    }
    ++i;
  }
  return out + "\"";
}

std::string chrome_trace_json(const std::vector<JobTrace>& jobs) {
  Clock::time_point base = Clock::time_point::max();
  for (const auto& job : jobs) {
    for (const auto& op : job.operations) base = std::min(base, op.started);
  }
  if (base == Clock::time_point::max()) base = Clock::now();
  Writer w(base);
  int pid = 1;
  for (const auto& job : jobs) {
    const int first_rank = job.job.node * job.job.local_world_size;
    w.metadata(pid, 0, "process_name",
               "job " + job.job.id + " (uid " + std::to_string(job.job.uid) + ", node " +
                   std::to_string(job.job.node) + " of " + std::to_string(job.job.nodes) + ")");
    w.metadata(pid, kOperationsTrack, "thread_name", "operations");
    w.sort_index(pid, kOperationsTrack, 0);
    for (int r = 0; r < job.job.local_world_size; ++r) {
      w.metadata(pid, kFirstRankTrack + r, "thread_name", "rank " + std::to_string(first_rank + r));
      w.sort_index(pid, kFirstRankTrack + r, 1 + r);
    }
    std::map<std::string, int> group_tracks;
    auto group_track = [&](const std::string& group) {
      auto [it, added] = group_tracks.emplace(group, kFirstGroupTrack + static_cast<int>(group_tracks.size()));
      if (added) {
        w.metadata(pid, it->second, "thread_name", "execution: group " + group);
        w.sort_index(pid, it->second, 100'000 + it->second);
      }
      return it->second;
    };
    for (const OpTrace& op : job.operations) {
      std::string args = "\"seq\":" + std::to_string(op.seq) + ",\"set\":" + std::to_string(op.set) +
                         ",\"buckets\":" + std::to_string(op.buckets.size() + op.buckets_left_out);
      if (op.buckets_left_out) args += ",\"buckets_left_out\":" + std::to_string(op.buckets_left_out);
      w.slice(pid, kOperationsTrack, "op " + std::to_string(op.seq) + " " + op.kind, op.started, op.finished, args);
      std::vector<Clock::time_point> previous(static_cast<size_t>(std::max(0, job.job.local_world_size)), op.started);
      for (const BucketTrace& b : op.buckets) {
        const std::string name = "bucket " + std::to_string(b.index);
        for (size_t r = 0; r < b.ready.size() && r < previous.size(); ++r) {
          if (b.ready[r] == Clock::time_point{}) continue;
          // A rank that was ready before the previous bucket's slice ended shows a zero slice.
          const Clock::time_point from = std::min(previous[r], b.ready[r]);
          w.slice(pid, kFirstRankTrack + static_cast<int>(r), name + " ready", from, b.ready[r],
                  "\"op\":" + std::to_string(op.seq));
          previous[r] = std::max(previous[r], b.ready[r]);
        }
        const int track = group_track(b.group);
        std::string parts = "\"op\":" + std::to_string(op.seq) + ",\"bytes\":" + std::to_string(b.bytes);
        if (b.parts.reported) {
          parts += ",\"local_reduction_us\":" + Writer::micros(b.parts.local);
          if (b.parts.cross_node) {
            parts += ",\"waiting_for_peers_us\":" + Writer::micros(b.parts.peers) +
                     ",\"collective_us\":" + Writer::micros(b.parts.collective);
          }
        }
        w.slice(pid, track, name + " (" + b.group + ")", b.launched, b.landed, parts);
        if (b.parts.reported && b.parts.cross_node && b.parts.peers.count() > 0) {
          w.slice(pid, track, "waiting for peers", b.launched,
                  std::min(b.landed, b.launched + std::chrono::duration_cast<Clock::duration>(b.parts.peers)));
        }
      }
    }
    ++pid;
  }
  return w.finish();
}

}  // namespace gradsync::admin
