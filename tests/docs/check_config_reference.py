#!/usr/bin/env python3
"""The configuration reference (docs/configuration.md) against gradsyncd --help.

Every flag gradsyncd takes must have a row in the reference's flag table, every flag there must
exist, and where --help shows a default, (=VALUE), a row of one flag must give the same
default. The settings SIGHUP applies at once, which --help lists last, must be the ones the
reference lists ("It applies at once: ..."). This is what keeps the reference true while the
settings are declared in daemon/config/settings.cc.

Usage: check_config_reference.py GRADSYNCD DOCS/CONFIGURATION.MD
"""
import re
import subprocess
import sys


def help_flags(gradsyncd):
    """The flags of --help with their defaults (None where it shows none), and the settings it
    says SIGHUP applies at once."""
    text = subprocess.run([gradsyncd, "--help"], capture_output=True, text=True, check=True).stdout
    flags = {}
    for line in text.splitlines():
        m = re.match(r"\s+(?:-\w \[ )?--([a-z0-9-]+)(?: \])?(?: arg)?(?: \(=([^)]*)\))?", line)
        if m:
            flags[m.group(1)] = m.group(2)
    live = re.search(r"SIGHUP re-reads the flags and the file, and applies at once: ([^.]*)\.", text)
    return flags, set(live.group(1).split(", ")) if live else set()


def doc_live(path):
    """The settings the reference says SIGHUP applies at once."""
    text = " ".join(open(path, encoding="utf-8").read().split())
    m = re.search(r"It applies at once: ([^.]*)\.", text)
    return set(re.findall(r"`([a-z0-9-]+)`", m.group(1))) if m else set()


def doc_rows(path):
    rows = {}
    in_table = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## Flag reference"):
            in_table = True
            continue
        if in_table and line.startswith("## "):
            break
        if not in_table or not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`--([a-z0-9-]+)`", cells[0])
        for name in names:
            rows[name] = (cells[1] if len(cells) > 1 else "", len(names))
    return rows


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    flags, live = help_flags(sys.argv[1])
    rows = doc_rows(sys.argv[2])
    problems = []
    documented_live = doc_live(sys.argv[2])
    if not live:
        problems.append("--help does not list the settings SIGHUP applies at once")
    for name in sorted(live - documented_live):
        problems.append(f"SIGHUP applies {name} at once, but the reference does not list it")
    for name in sorted(documented_live - live):
        problems.append(f"the reference lists {name} as applied at once by SIGHUP, but it needs a restart")
    if len(flags) < 30 or len(rows) < 30:
        problems.append(f"too few flags read ({len(flags)} from --help, {len(rows)} from the reference): "
                        "has a format changed?")
    for name in sorted(set(flags) - set(rows)):
        problems.append(f"--{name} is a flag of gradsyncd but has no row in the reference")
    for name in sorted(set(rows) - set(flags)):
        problems.append(f"--{name} has a row in the reference but gradsyncd has no such flag")
    for name, default in sorted(flags.items()):
        if default is None or name not in rows:
            continue
        cell, shared = rows[name]
        if shared > 1:
            continue  # a row for several flags describes their defaults in words
        if not cell.replace("`", "").startswith(default):
            problems.append(f"--{name}: --help gives the default {default}, the reference '{cell}'")
    for p in problems:
        print("check_config_reference: " + p)
    print(f"check_config_reference: {len(flags)} flags, {len(rows)} rows, {len(live)} applied by SIGHUP, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
