#include "tests/bench/report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace gradsync::bench {
namespace {

std::vector<double> sorted(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), v >= 100 ? "%.1f" : v >= 10 ? "%.2f" : "%.3f", v);
  return text;
}

// "12.3 ms (11.9-13.0)", or "missing" / "skipped" / "n/a".
std::string cell(const Measurement& m, const std::string& unit) {
  if (!m.ok()) return m.skipped ? (m.note == "n/a" ? "n/a" : "skipped") : "missing";
  if (m.samples.size() == 1) return number(m.median()) + " " + unit;
  return number(m.median()) + " " + unit + " (" + number(m.min()) + "-" + number(m.max()) + ")";
}

std::optional<double> ratio(const Measurement& a, const Measurement& b) {
  if (!a.ok() || !b.ok() || b.median() <= 0) return std::nullopt;
  return a.median() / b.median();
}

std::string ratio_cell(const Measurement& a, const Measurement& b) {
  const auto r = ratio(a, b);
  if (!r) return a.is_missing() || b.is_missing() ? "missing" : "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2fx", *r);
  return text;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(std::optional<double> v) {
  if (!v) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", *v);
  return text;
}

std::string json_measurement(const Measurement& m) {
  std::string samples = "[";
  for (size_t i = 0; i < m.samples.size(); ++i) samples += (i ? "," : "") + json_number(m.samples[i]);
  samples += "]";
  const char* status = m.ok() ? "measured" : m.skipped ? "skipped" : "missing";
  return std::string("{\"median\": ") + json_number(m.ok() ? std::optional(m.median()) : std::nullopt) +
         ", \"min\": " + json_number(m.ok() ? std::optional(m.min()) : std::nullopt) +
         ", \"max\": " + json_number(m.ok() ? std::optional(m.max()) : std::nullopt) + ", \"samples\": " + samples +
         ", \"status\": \"" + status + "\", \"note\": " + json_string(m.note) + "}";
}

}  // namespace

double Measurement::median() const {
  const auto s = sorted(samples);
  const size_t n = s.size();
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
double Measurement::min() const { return *std::min_element(samples.begin(), samples.end()); }
double Measurement::max() const { return *std::max_element(samples.begin(), samples.end()); }

Measurement measured(std::vector<double> samples) {
  if (samples.empty()) return missing("no samples were taken");
  return Measurement{std::move(samples), false, {}};
}
Measurement skipped(const std::string& why) { return Measurement{{}, true, why}; }
Measurement missing(const std::string& why) { return Measurement{{}, false, why}; }

void print_table(const std::vector<Row>& rows) {
  std::printf("\n| measurement | gradsync | floor | ratio to floor | peer (torch gloo) | ratio to peer | derived |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s%s | %s | %s | %s | %s |\n", r.name.c_str(), cell(r.gradsync, r.unit).c_str(),
                cell(r.floor, r.unit).c_str(), r.floor_name.empty() ? "" : (" (" + r.floor_name + ")").c_str(),
                ratio_cell(r.gradsync, r.floor).c_str(), cell(r.peer, r.unit).c_str(),
                r.peer.skipped && r.peer.note == "n/a" ? "-" : ratio_cell(r.gradsync, r.peer).c_str(),
                r.derived.empty() ? "-" : r.derived.c_str());
  }
  bool header = false;
  for (const Row& r : rows) {
    const std::pair<const char*, const Measurement*> parts[] = {{"gradsync", &r.gradsync}, {"floor", &r.floor}, {"peer", &r.peer}};
    for (const auto& [which, m] : parts) {
      if (m->ok() || m->note == "n/a") continue;
      if (!header) std::printf("\n"), header = true;
      std::printf("%s: %s, %s: %s\n", m->skipped ? "skipped" : "missing", r.name.c_str(), which, m->note.c_str());
    }
  }
}

bool write_json(const std::string& file, const std::vector<Row>& rows,
                const std::vector<std::pair<std::string, std::string>>& extra) {
  std::ofstream out(file);
  if (!out) return false;
  out << "{\"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "  {\"name\": " << json_string(r.name) << ", \"unit\": " << json_string(r.unit)
        << ", \"gradsync\": " << json_measurement(r.gradsync) << ", \"floor\": " << json_measurement(r.floor)
        << ", \"floor_name\": " << json_string(r.floor_name) << ", \"peer\": " << json_measurement(r.peer)
        << ", \"ratio_to_floor\": " << json_number(ratio(r.gradsync, r.floor))
        << ", \"ratio_to_peer\": " << json_number(ratio(r.gradsync, r.peer))
        << ", \"derived\": " << json_string(r.derived) << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "], \"extra\": {";
  for (size_t i = 0; i < extra.size(); ++i) {
    out << (i ? ", " : "") << json_string(extra[i].first) << ": " << json_string(extra[i].second);
  }
  out << "}}\n";
  return static_cast<bool>(out);
}

std::vector<std::string> missing_measurements(const std::vector<Row>& rows) {
  std::vector<std::string> out;
  for (const Row& r : rows) {
    if (r.gradsync.is_missing()) out.push_back(r.name + ": gradsync: " + r.gradsync.note);
    if (r.floor.is_missing()) out.push_back(r.name + ": floor: " + r.floor.note);
    if (r.peer.is_missing()) out.push_back(r.name + ": peer: " + r.peer.note);
  }
  return out;
}

}  // namespace gradsync::bench
