// gradsyncd's settings, each declared once (settings.cc), in the manner of NCCL's param.h but
// with no globals: a declaration is a value that holds the setting's name (its flag and its
// TOML key), its help, whether SIGHUP applies it at once or it waits for a restart, and how its
// text fills its field of DaemonConfig, with the bounds. Everything that names settings reads
// these declarations: the command line and the TOML file (parse_daemon_config), --help,
// SIGHUP's diff (Daemon::reload), `gradsyncctl config get` (the admin view) and, through
// --help, the configuration reference in docs/configuration.md, which a test compares.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"

namespace gradsync {

// When a changed value takes effect.
enum class Reload {
  kLive,     // at SIGHUP (for what it governs from then on: new jobs, new connections)
  kRestart,  // when gradsyncd restarts; SIGHUP names it in a warning and keeps the running value
};

struct SettingSpec {
  std::string name;  // the flag without "--", and the TOML key
  std::string help;
  Reload reload = Reload::kRestart;
  bool repeatable = false;  // a flag given many times, an array in TOML

  // Reads the value(s) given into *config. False with *why, the rest of a sentence whose subject
  // is the setting ("must be ..., not 'x'"), when a value is refused.
  std::function<bool(const std::vector<std::string>& values, DaemonConfig* config, std::string* why)> parse;
  // The value as text: --help's default (the text of DaemonConfig{}, shown when not empty), and
  // what SIGHUP compares.
  std::function<std::string(const DaemonConfig&)> text;
  // What `config get` shows: the text, or a phrase for an empty one, or a value derived from it.
  std::function<std::string(const DaemonConfig&)> show;
  // Copies this setting's field(s) from `from` to `to`: what SIGHUP does for a live setting.
  std::function<void(const DaemonConfig& from, DaemonConfig* to)> copy;
};

// Every setting of gradsyncd, in --help's order.
std::vector<SettingSpec> daemon_settings();

// The declaration named `name` in `settings`, or null.
const SettingSpec* find_setting(const std::vector<SettingSpec>& settings, std::string_view name);

}  // namespace gradsync
