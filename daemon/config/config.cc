#include "daemon/config/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "daemon/config/config_file.h"
#include "daemon/config/setting.h"
#include "daemon/rendezvous/etcd_access.h"
#include "daemon/util/safe_text.h"
#include "shared/host_port.h"
#include "shared/socket_names.h"
#include "shared/version.h"

namespace gradsync {
namespace {

namespace po = boost::program_options;

// Where each setting given was given: absent for the command line, "FILE:LINE" for the file.
using Origins = std::map<std::string, std::string>;

// The rules that join settings, once each was read: the admin service's defaults and TLS, the
// job bounds' order, the peer service's default address and its loopback rule, ibverbs' device.
// An error, naming where the settings involved were given, or empty.
std::string check_together(const Origins& origins, DaemonConfig* config) {
  const auto at = [&](std::initializer_list<const char*> names) {
    std::string where;
    for (const char* name : names) {
      if (auto it = origins.find(name); it != origins.end()) {
        where += (where.empty() ? " (" : ", ") + std::string(name) + " at " + it->second;
      }
    }
    return where.empty() ? where : where + ")";
  };
  if (config->admin_address.empty()) config->admin_address = "unix:" + admin_socket_for(config->socket_path);
  if (!config->admin_tcp.empty() &&
      (config->admin_tls_cert.empty() || config->admin_tls_key.empty() || config->admin_tls_ca.empty())) {
    return "--admin " + safe_text(config->admin_tcp, 256) +
           " (TCP) requires mutual TLS: give --admin-tls-cert, --admin-tls-key and --admin-tls-ca" + at({"admin"});
  }
  if (config->admin_tcp.empty() && (!config->admin_tls_cert.empty() || !config->admin_tls_key.empty() ||
                                    !config->admin_tls_ca.empty() || !config->admin_tls_admin_cns.empty())) {
    return "--admin-tls-* apply to the admin service over TCP: give --admin HOST:PORT too" +
           at({"admin-tls-cert", "admin-tls-key", "admin-tls-ca", "admin-tls-admin-cn"});
  }
  if (config->max_timeout < config->default_timeout) {
    return "--max-timeout-ms must be at least --timeout-ms" + at({"max-timeout-ms", "timeout-ms"});
  }
  if (config->reduce_threads == 0) config->reduce_threads = std::max(1u, std::thread::hardware_concurrency());
  const bool peer_auth = !config->peer_token_file.empty() || !config->peer_tls_ca.empty();
  if (config->peer_listen.empty()) config->peer_listen = peer_auth ? "0.0.0.0:29590" : "127.0.0.1:29590";
  HostPort listen;
  std::string why;
  if (!parse_host_port(config->peer_listen, &listen, &why)) return "--peer-listen: " + safe_text(why, 128);
  if (!peer_auth) {
    // An address, not a name (which could resolve anywhere): 127.0.0.0/8 or ::1.
    if (listen.host == "localhost" && !listen.bracketed) {
      listen.host = "127.0.0.1";
      config->peer_listen = listen.text();
    }
    in_addr v4{};
    in6_addr v6{};
    const bool loopback =
        (!listen.bracketed && ::inet_pton(AF_INET, listen.host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
        (listen.bracketed && ::inet_pton(AF_INET6, listen.host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6));
    if (!loopback) {
      return "--peer-listen " + safe_text(config->peer_listen, 256) +
             ": the peer service is not authenticated, so it may listen on loopback only; for other nodes to reach "
             "it give --peer-token-file FILE (the same token on every node) or --peer-tls-cert, --peer-tls-key and "
             "--peer-tls-ca" +
             at({"peer-listen"});
    }
  }
  if (Status etcd = EtcdAccess::check(config->etcd); !etcd.ok()) {
    return etcd.message() + at({"etcd-endpoints", "etcd-user", "etcd-tls-cert", "etcd-prefix"});
  }
  if (config->gloo_transport == "ibverbs" && config->gloo_ib_device.empty()) {
    return "--gloo-transport ibverbs needs --gloo-ib-device" + at({"gloo-transport"});
  }
  return "";
}

}  // namespace

ParsedConfig parse_daemon_config(int argc, const char* const* argv) {
  const std::vector<SettingSpec> table = daemon_settings();
  const DaemonConfig defaults;
  po::options_description general("Options");
  general.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("config", po::value<std::string>(),
       "read settings from this TOML file (keys are the flags' names, e.g. timeout-ms = 30000, "
       "allow-uid = [1000, 1001]); flags given here win over it");
  // Every value is read as text here and by its declaration's parser below, so that the
  // command line and the file meet the same rules and the same messages.
  po::options_description settings("Settings (flags or config file)");
  std::string live;  // the settings SIGHUP applies at once, for --help
  for (const SettingSpec& spec : table) {
    if (spec.repeatable) {
      settings.add_options()(spec.name.c_str(), po::value<std::vector<std::string>>()->composing(), spec.help.c_str());
    } else if (const std::string value = spec.text(defaults); !value.empty()) {
      settings.add_options()(spec.name.c_str(), po::value<std::string>()->default_value(value), spec.help.c_str());
    } else {
      settings.add_options()(spec.name.c_str(), po::value<std::string>(), spec.help.c_str());
    }
    if (spec.reload == Reload::kLive) live += (live.empty() ? "" : ", ") + spec.name;
  }
  po::options_description all;
  all.add(general).add(settings);

  ParsedConfig result;
  const auto fail = [&](const std::string& why) {
    result.message = "gradsyncd: " + why;
    result.exit_code = 2;
    return result;
  };
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, all), vm);
  } catch (const po::error& e) {
    return fail(std::string(e.what()) + "\nTry 'gradsyncd --help'.");
  }
  if (vm.count("help")) {
    std::ostringstream usage;
    usage << "Usage: gradsyncd [options]\n\n"
          << "gradsyncd reduces the gradients of the trainers on this node. Trainers connect to its\n"
          << "control socket, register shared-memory tensors once, and signal each step through\n"
          << "shared-memory rings.\n\n"
          << all << "\nSIGHUP re-reads the flags and the file, and applies at once: " << live
          << ". The others take effect when gradsyncd restarts.\n";
    result.message = usage.str();
    return result;
  }
  if (vm.count("version")) {
    result.message = std::string("gradsyncd ") + kGradsyncVersion + " (protocol " +
                     std::to_string(kProtocolVersion) + ")";
    return result;
  }

  DaemonConfig config;
  Origins origins;
  // The command line first: a flag given there wins over the file, repeatable ones too (their
  // values would otherwise be merged, and a list such as allow-uid could only grow).
  for (const SettingSpec& spec : table) {
    if (!vm.count(spec.name) || vm[spec.name].defaulted()) continue;
    const std::vector<std::string> values = spec.repeatable ? vm[spec.name].as<std::vector<std::string>>()
                                                            : std::vector<std::string>{vm[spec.name].as<std::string>()};
    if (std::string why; !spec.parse(values, &config, &why)) {
      return fail("--" + spec.name + (why.rfind("must", 0) == 0 ? " " : ": ") + why + "\nTry 'gradsyncd --help'.");
    }
  }
  if (vm.count("config")) {
    std::vector<FileSetting> file;
    if (Status s = read_config_file(vm["config"].as<std::string>(), &file); !s.ok()) return fail(s.message());
    for (const FileSetting& setting : file) {
      const auto file_error = [&](const std::string& why) { return fail("config file " + setting.where + ": " + why); };
      const SettingSpec* spec = find_setting(table, setting.name);
      if (spec == nullptr) return file_error("unknown setting '" + setting.name + "' (gradsyncd --help lists them)");
      if (auto [first, fresh] = origins.emplace(setting.name, setting.where); !fresh) {
        return file_error(setting.name + " is set twice: here and at " + first->second +
                          " (an underscore stands for a dash: timeout_ms is timeout-ms)");
      }
      if (vm.count(setting.name) && !vm[setting.name].defaulted()) continue;
      if (std::string why; !spec->parse(setting.values, &config, &why)) {
        return file_error(setting.name + (why.rfind("must", 0) == 0 ? " " : ": ") + why);
      }
    }
    // Those the command line gave were not read from the file: their origin is the command line.
    for (auto it = origins.begin(); it != origins.end();) {
      it = vm.count(it->first) && !vm[it->first].defaulted() ? origins.erase(it) : std::next(it);
    }
  }
  if (std::string why = check_together(origins, &config); !why.empty()) {
    return fail(why + "\nTry 'gradsyncd --help'.");
  }
  result.config = config;
  return result;
}

}  // namespace gradsync
