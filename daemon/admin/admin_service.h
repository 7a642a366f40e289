// The gradsync.admin.v1.Admin service: turns the daemon's snapshots (view.h) into replies, after
// checking the caller (by the peer credentials its connection was accepted with).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "daemon/admin/view.h"
#include "daemon/control/peer_credentials.h"
#include "daemon/util/log.h"
#include "proto/admin.grpc.pb.h"

namespace gradsync::admin {

// Who is calling: a local user (by the Unix socket's peer credentials, or the local user a TLS
// client certificate's common name names), or a certificate named as an administrator.
struct Caller {
  uid_t uid = 0;
  bool admin_certificate = false;  // privileged by --admin-tls-admin-cn
  std::string certificate;         // the common name, for TLS callers
};

// Who the call's connection belongs to; false (with *why) when it cannot be told.
using CallerLookup = std::function<bool(grpc::ServerContext* context, Caller* out, std::string* why)>;

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(DaemonView* view, CallerLookup caller, Logger log)
      : view_(view), caller_(std::move(caller)), log_(std::move(log)) {}

  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::GetStatusReply* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsReply* reply) override;
  grpc::Status ListClients(grpc::ServerContext* context, const v1::ListClientsRequest* request,
                           v1::ListClientsReply* reply) override;
  grpc::Status GetInFlight(grpc::ServerContext* context, const v1::GetInFlightRequest* request,
                           v1::GetInFlightReply* reply) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsReply* reply) override;
  grpc::Status DumpTrace(grpc::ServerContext* context, const v1::DumpTraceRequest* request,
                         v1::DumpTraceReply* reply) override;
  grpc::Status SetConfig(grpc::ServerContext* context, const v1::SetConfigRequest* request,
                         v1::SetConfigReply* reply) override;
  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request, v1::DrainReply* reply) override;

 private:
  // Ok when the caller may read; PERMISSION_DENIED naming its uid otherwise. *sees_all: the
  // caller is privileged (root, the daemon's user, the admin group) and sees every user's
  // jobs; others see their own.
  grpc::Status check_reader(grpc::ServerContext* context, uid_t* uid, bool* sees_all) const;
  // Ok when the caller may make the mutating call `call`; PERMISSION_DENIED naming its uid
  // and who may otherwise.
  grpc::Status check_admin(grpc::ServerContext* context, const char* call, uid_t* uid, std::string* who) const;

  DaemonView* view_;
  CallerLookup caller_;
  Logger log_;  // mutating calls are logged with who made them
};

}  // namespace gradsync::admin
