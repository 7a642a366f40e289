// gradsyncd's settings table (daemon/config/setting.h, settings.cc): every declaration is whole
// and round-trips its default; a live setting's copy carries exactly its own field; integers
// are read strictly with inclusive bounds; and parse_daemon_config reads flags and the file
// through the same declarations.
#include "daemon/config/setting.h"

#include <catch2/catch.hpp>

#include <set>

namespace gradsync {
namespace {

// A value each kind of setting takes that differs from the default, for the copy checks.
std::string other_value(const SettingSpec& spec, const DaemonConfig& defaults) {
  if (spec.name == "log-level") return "debug";
  if (spec.name == "admin") return "unix:/tmp/x.admin";
  if (spec.name == "allow-uid" || spec.name == "legacy-ipc-uid") return "4242";
  const std::string value = spec.text(defaults);
  if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos) {
    return std::to_string(std::stoull(value) + 1);  // every default is below its upper bound
  }
  return spec.name == "gloo-transport" ? "ibverbs" : spec.name == "peer-listen" || spec.name == "metrics"
                                                          ? "127.0.0.1:7"
                                                          : "x";
}

}  // namespace

TEST_CASE("settings: every declaration is whole, named once, and parses its own default back", "[settings]") {
  const std::vector<SettingSpec> table = daemon_settings();
  REQUIRE(table.size() >= 40);
  const DaemonConfig defaults;
  std::set<std::string> names;
  for (const SettingSpec& spec : table) {
    CAPTURE(spec.name);
    CHECK(names.insert(spec.name).second);
    CHECK_FALSE(spec.help.empty());
    REQUIRE(spec.parse);
    REQUIRE(spec.text);
    REQUIRE(spec.show);
    REQUIRE(spec.copy);
    CHECK(find_setting(table, spec.name) == &spec);
    const std::string value = spec.text(defaults);
    if (value.empty() || spec.repeatable) continue;
    DaemonConfig parsed;
    std::string why;
    CHECK(spec.parse({value}, &parsed, &why));
    CHECK(why.empty());
    CHECK(spec.text(parsed) == value);
  }
  CHECK(find_setting(table, "no-such-setting") == nullptr);
}

TEST_CASE("settings: a copy carries its own setting and no other (what SIGHUP applies)", "[settings]") {
  const std::vector<SettingSpec> table = daemon_settings();
  const DaemonConfig defaults;
  for (const SettingSpec& spec : table) {
    CAPTURE(spec.name);
    DaemonConfig changed;
    std::string why;
    REQUIRE(spec.parse({other_value(spec, defaults)}, &changed, &why));
    REQUIRE(spec.text(changed) != spec.text(defaults));
    DaemonConfig target;
    spec.copy(changed, &target);
    CHECK(spec.text(target) == spec.text(changed));
    for (const SettingSpec& other : table) {
      if (&other != &spec) CHECK(other.text(target) == other.text(defaults));
    }
  }
}

TEST_CASE("settings: integers are digits only, within inclusive bounds, and each refusal names them", "[settings]") {
  const std::vector<SettingSpec> table = daemon_settings();
  const SettingSpec* jobs = find_setting(table, "max-jobs");
  REQUIRE(jobs != nullptr);
  DaemonConfig config;
  std::string why;
  CHECK(jobs->parse({"1"}, &config, &why));
  CHECK(config.limits.jobs == 1);
  CHECK(jobs->parse({"4096"}, &config, &why));
  CHECK(config.limits.jobs == 4096);
  for (const char* bad : {"0", "4097", "-1", "+1", " 1", "1k", "", "99999999999999999999999"}) {
    CAPTURE(bad);
    why.clear();
    CHECK_FALSE(jobs->parse({bad}, &config, &why));
    CHECK(why == std::string("must be an integer from 1 to 4096 (each job has a thread), not '") + bad + "'");
    CHECK(config.limits.jobs == 4096);
  }
  CHECK_FALSE(jobs->parse({"1", "2"}, &config, &why));
  CHECK(why == "takes one value, not 2");
  const SettingSpec* timeout = find_setting(table, "timeout-ms");
  REQUIRE(timeout != nullptr);
  CHECK(timeout->parse({"86400000"}, &config, &why));
  CHECK(config.default_timeout == std::chrono::milliseconds(86'400'000));
  CHECK_FALSE(timeout->parse({"86400001"}, &config, &why));
  CHECK(timeout->reload == Reload::kLive);
  CHECK(find_setting(table, "reduce-threads")->reload == Reload::kRestart);
}

TEST_CASE("settings: parse_daemon_config reads flags through the declarations and applies the joint rules",
          "[settings]") {
  const auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "gradsyncd");
    return parse_daemon_config(static_cast<int>(args.size()), args.data());
  };
  ParsedConfig ok = parse({"--timeout-ms", "1234", "--allow-uid", "0", "--allow-uid", "7", "--socket", "/tmp/s.sock"});
  REQUIRE(ok.config);
  CHECK(ok.config->default_timeout == std::chrono::milliseconds(1234));
  CHECK(ok.config->allowed_uids == std::vector<uid_t>{0, 7});
  CHECK(ok.config->admin_address == "unix:/tmp/s.sock.admin");
  CHECK(ok.config->peer_listen == "127.0.0.1:29590");
  CHECK(ok.config->reduce_threads >= 1);

  ParsedConfig bad = parse({"--timeout-ms", "soon"});
  CHECK_FALSE(bad.config);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.message, Catch::Contains("--timeout-ms must be an integer from 1 to 86400000 (a day), not 'soon'"));
  ParsedConfig order = parse({"--timeout-ms", "5000", "--max-timeout-ms", "4000"});
  CHECK_THAT(order.message, Catch::Contains("--max-timeout-ms must be at least --timeout-ms"));
  ParsedConfig open = parse({"--peer-listen", "0.0.0.0:1"});
  CHECK_THAT(open.message, Catch::Contains("may listen on loopback only"));
  ParsedConfig help = parse({"--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.message, Catch::Contains("--max-jobs arg (=64)") &&
                               Catch::Contains("SIGHUP re-reads the flags and the file, and applies at once: "));
}

}  // namespace gradsync
