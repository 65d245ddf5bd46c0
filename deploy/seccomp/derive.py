#!/usr/bin/env python3
"""Derives memwatch's seccomp profile from a container runtime's default.

Usage: deploy/seccomp/derive.py DEFAULT.json > memwatch.json

DEFAULT.json is a runtime's default profile in the Docker/containers JSON
format (Debian 12's containers-common ships it as
/usr/share/containers/seccomp.json). Older defaults allow bpf(2) and
perf_event_open(2) only to a container with CAP_SYS_ADMIN; memwatch runs
with CAP_BPF and CAP_PERFMON instead (Linux 5.8+). The derived profile is
the default unchanged, except that those two calls are taken out of the
rules that name them and given three rules each, of which exactly one
applies to a container:

  allowed with the new capability (CAP_BPF, CAP_PERFMON);
  allowed with CAP_SYS_ADMIN but not the new one (as the default does);
  refused (EPERM, as the default does) with neither.

Rules whose `includes`/`excludes` name capabilities are kept apart so that
two rules never apply to one call: runtimes refuse a profile in which they
conflict. The output is stable (same input, same bytes): the shipped
deploy/seccomp/memwatch.json is this script's output for Debian 12's
containers-common, which a test checks.
"""

import copy
import json
import sys

CALLS = {"bpf": "CAP_BPF", "perf_event_open": "CAP_PERFMON"}


def derive(default):
    profile = copy.deepcopy(default)
    kept = []
    for rule in profile["syscalls"]:
        names = [n for n in rule["names"] if n not in CALLS]
        if names:
            rule["names"] = names
            kept.append(rule)
    for call, cap in CALLS.items():
        kept.append(
            {
                "names": [call],
                "action": "SCMP_ACT_ALLOW",
                "comment": f"memwatch: {call} with {cap}",
                "includes": {"caps": [cap]},
            }
        )
        kept.append(
            {
                "names": [call],
                "action": "SCMP_ACT_ALLOW",
                "comment": f"memwatch: {call} with CAP_SYS_ADMIN, as the default",
                "includes": {"caps": ["CAP_SYS_ADMIN"]},
                "excludes": {"caps": [cap]},
            }
        )
        kept.append(
            {
                "names": [call],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": 1,
                "comment": f"memwatch: {call} refused (EPERM) without either",
                "excludes": {"caps": ["CAP_SYS_ADMIN", cap]},
            }
        )
    profile["syscalls"] = kept
    return profile


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    with open(sys.argv[1]) as f:
        default = json.load(f)
    json.dump(derive(default), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
