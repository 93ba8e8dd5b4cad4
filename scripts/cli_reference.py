#!/usr/bin/env python3
"""Writes the guide's command-line reference (Markdown) from the --help texts of a
caf-hvd binary, as the man pages are made: usage: cli_reference.py CAF_HVD > cli.md.
Fails, naming it, when a subcommand's --help does not answer with exit 0."""

import subprocess
import sys

SUBCOMMANDS = [
    ("run", "a whole job on this machine"),
    ("driver", "a job across node agents"),
    ("node", "the node agent of a host"),
    ("status", "the cluster's nodes and jobs"),
    ("drain", "take a node out of placement"),
    ("undrain", "return a drained node"),
    ("cluster", "a cluster's credentials"),
    ("timeline", "draw a job's event log"),
    ("hosts", "the hosts a job would use"),
]


def help_of(binary, *args):
    p = subprocess.run([binary, *args, "--help"], capture_output=True, text=True, timeout=30)
    text = (p.stdout or p.stderr).rstrip()
    if p.returncode != 0 or not text:
        sys.exit(f"cli_reference: '{' '.join(['caf-hvd', *args, '--help'])}' ended with "
                 f"{p.returncode}: {p.stderr.strip()[:300]}")
    return text


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: cli_reference.py CAF_HVD")
    binary = sys.argv[1]
    out = ["# Command line", "",
           "Written from the `--help` texts of the `caf-hvd` binary this guide was built "
           "with (the Debian package's man pages come from the same texts).", "",
           "```text", help_of(binary), "```", ""]
    for sub, what in SUBCOMMANDS:
        out += [f"## caf-hvd {sub}", "", f"{what[0].upper()}{what[1:]}.", "", "```text",
                help_of(binary, sub), "```", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
