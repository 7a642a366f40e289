// The benchmark's table: each row is gradsync next to its floor (the least this machine can do
// for that work, measured in the same run) and, where there is one, the peer (torch gloo).
// A measurement is its samples (one per timed step, or per run of a floor); the table prints
// the median with the min-max range. One that could not be taken is "missing", with why, and
// makes the bench exit non-zero; one deliberately not taken is "skipped", with why.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gradsync::bench {

struct Measurement {
  std::vector<double> samples;  // in the row's unit; empty when not measured
  bool skipped = false;         // deliberately not measured (or not applicable)
  std::string note;             // why there are no samples

  bool ok() const { return !samples.empty(); }
  bool is_missing() const { return samples.empty() && !skipped; }
  double median() const;
  double min() const;
  double max() const;
};

Measurement measured(std::vector<double> samples);
Measurement skipped(const std::string& why);
Measurement missing(const std::string& why);

struct Row {
  std::string name;        // what was measured, e.g. "4 clients x 100 MiB float32"
  std::string unit;        // "ms" or "us"
  Measurement gradsync;
  Measurement floor;
  std::string floor_name;  // e.g. "memory floor, 2 threads"
  Measurement peer;
  std::string derived;     // an extra figure computed from the row, e.g. "0.4 us per tensor"
};

// The Markdown table, then one line per missing or skipped measurement saying why.
void print_table(const std::vector<Row>& rows);

// The same table as JSON: {"rows": [{"name", "unit", "gradsync": {"median", "min", "max",
// "samples", "status", "note"}, "floor": {...}, "floor_name", "peer": {...}, "ratio_to_floor",
// "ratio_to_peer", "derived"}], "extra": {...}}. Returns false when FILE cannot be written.
bool write_json(const std::string& file, const std::vector<Row>& rows,
                const std::vector<std::pair<std::string, std::string>>& extra);

// Every missing measurement, as "row: which: why".
std::vector<std::string> missing_measurements(const std::vector<Row>& rows);

}  // namespace gradsync::bench
