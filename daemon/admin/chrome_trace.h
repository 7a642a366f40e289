// Chrome trace event JSON (the format chrome://tracing and ui.perfetto.dev open) of jobs' recent
// operations: one process per job; in it one track of operations, one track per local rank (a
// slice per bucket, from the rank's previous bucket or the operation's start to when it made
// this one ready, so a straggler's slices stand out) and one track per process group's
// execution (a slice per bucket with its parts as arguments, the wait for other nodes nested).
#pragma once

#include <string>
#include <vector>

#include "daemon/admin/snapshot.h"
#include "daemon/job/trace.h"

namespace gradsync::admin {

struct JobTrace {
  JobInfo job;
  std::vector<OpTrace> operations;
};

std::string chrome_trace_json(const std::vector<JobTrace>& jobs);

// `text` as a JSON string literal, quotes included; control characters and non-ASCII bytes are
// escaped, so client-chosen names cannot break the document.
std::string json_string(const std::string& text);

}  // namespace gradsync::admin
