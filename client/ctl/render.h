// gradsyncctl's readable output: one function per reply, tables padded to their widest cell.
// Every string in a reply may come from a client, so tables show control characters as '?'.
#pragma once

#include <string>

#include "proto/admin.pb.h"

namespace gradsync::ctl {

std::string print_status(const admin::v1::GetStatusReply& reply);
std::string print_config(const admin::v1::GetStatusReply& reply);  // the settings table alone
std::string print_jobs(const admin::v1::ListJobsReply& reply);
std::string print_clients(const admin::v1::ListClientsReply& reply);
std::string print_stats(const admin::v1::GetStatsReply& reply);
std::string print_inflight(const admin::v1::GetInFlightReply& reply);
std::string print_config_change(const admin::v1::SetConfigReply& reply);
std::string print_drain(const admin::v1::DrainReply& reply);
std::string print_trace(const admin::v1::DumpTraceReply& reply);

}  // namespace gradsync::ctl
