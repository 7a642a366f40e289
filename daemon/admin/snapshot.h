// What the admin service reports, as plain values: filled on the threads that own the state
// (the io thread for jobs and clients, a job's worker thread for its operations) and copied out,
// so the admin's gRPC threads never touch live daemon state.
#pragma once

#include "daemon/control/client_report.h"
#include "daemon/job/reports.h"

namespace gradsync::admin {

// The job's and the control session's reports (job/reports.h, control/client_report.h), by the
// names the admin service uses.
using PendingBucket = gradsync::PendingBucket;
using RemoteNode = gradsync::RemoteNode;
using PendingOperation = gradsync::PendingOperation;
using JobInfo = gradsync::JobInfo;
using ClientInfo = gradsync::ClientInfo;

}  // namespace gradsync::admin
