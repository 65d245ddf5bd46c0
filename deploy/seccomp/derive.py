#!/usr/bin/env python3
"""Derives memwatch's seccomp profile from the container runtimes' defaults,
and proves a profile is no wider than them.

Usage:
  deploy/seccomp/derive.py derive CONTAINERS_COMMON.json CONTAINERD_SRC > memwatch.json
  deploy/seccomp/derive.py verify PROFILE.json CONTAINERS_COMMON.json CONTAINERD_SRC

CONTAINERS_COMMON.json is the default of CRI-O and podman (containers-common's
seccomp.json; Debian: /usr/share/containers/seccomp.json). CONTAINERD_SRC is
containerd's contrib/seccomp directory, whose default is Go code, not data
(Debian's golang-github-containerd-containerd-dev:
/usr/share/gocode/src/github.com/containerd/containerd/contrib/seccomp): its
DefaultProfile is compiled and run here with Go (GOPATH mode, Debian's
golang-go, golang-github-opencontainers-specs-dev, golang-golang-x-sys-dev),
once per architecture, for memwatch's capabilities.

Both defaults depend on the container's capabilities and architecture. They
are evaluated for memwatch's container (capabilities CAP_BPF and CAP_PERFMON
only, as the DaemonSet grants) on x86_64 and aarch64, and memwatch's profile
is their intersection: a call allowed unconditionally only where every
default allows it unconditionally; where one allows it only for some
arguments, only those arguments (rules both hold); not at all where either
refuses it. Then exactly the calls memwatch needs and containers-common
refuses to CAP_BPF/CAP_PERFMON (it allows them only with CAP_SYS_ADMIN):
bpf and perf_event_open, which containerd's default allows with those
capabilities.

The profile has no `includes`/`excludes`: containerd reads a Localhost
profile as runtime-spec JSON, which has no such fields, so every rule there
applies unconditionally; CRI-O and podman read the same rules the same way.
Its `archMap` is read by CRI-O and podman; containerd ignores it and filters
the native architecture only. The output is stable (same inputs, same bytes):
the shipped deploy/seccomp/memwatch.json is this script's output for
Debian 12's containers-common and containerd, which a test checks.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

CAPS = ["CAP_BPF", "CAP_PERFMON"]
# Go's GOARCH, containers-common's `includes.arches`, libseccomp's arch.
ARCHES = {"amd64": "SCMP_ARCH_X86_64", "arm64": "SCMP_ARCH_AARCH64"}
ADDITIONS = ["bpf", "perf_event_open"]
ALLOW = "SCMP_ACT_ALLOW"

MAIN_GO = """package main

import (
	"encoding/json"
	"os"
	"strings"

	"memwatchderive/seccomp"

	"github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	seccomp.TargetArch = os.Args[1]
	caps := strings.Split(os.Args[2], ",")
	spec := &specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: caps},
	}}
	if err := json.NewEncoder(os.Stdout).Encode(seccomp.DefaultProfile(spec)); err != nil {
		panic(err)
	}
}
"""


def containerd_defaults(src):
    """containerd's DefaultProfile for memwatch's capabilities, by arch:
    seccomp_default.go compiled as it is, but for the arch named at run time
    (runtime.GOARCH read from a variable) so one host evaluates every arch."""
    with open(os.path.join(src, "seccomp_default.go")) as f:
        code = f.read()
    if code.count("runtime.GOARCH") < 2:
        raise SystemExit(f"{src}: DefaultProfile no longer switches on runtime.GOARCH")
    code = code.replace("runtime.GOARCH", "TargetArch")
    code = re.sub(r'\n\t"runtime"\n', "\n", code)
    code += "\n// TargetArch stands for runtime.GOARCH (memwatch's derive.py).\nvar TargetArch string\n"
    with tempfile.TemporaryDirectory() as gopath:
        pkg = os.path.join(gopath, "src", "memwatchderive")
        os.makedirs(os.path.join(pkg, "seccomp"))
        os.makedirs(os.path.join(pkg, "main"))
        with open(os.path.join(pkg, "seccomp", "seccomp_default.go"), "w") as f:
            f.write(code)
        with open(os.path.join(pkg, "main", "main.go"), "w") as f:
            f.write(MAIN_GO)
        env = dict(os.environ, GO111MODULE="off", GOPATH=f"{gopath}:/usr/share/gocode",
                   GOCACHE=os.path.join(gopath, "cache"))
        binary = os.path.join(gopath, "dump")
        subprocess.run(["go", "build", "-o", binary, "memwatchderive/main"], env=env, check=True)
        return {
            arch: json.loads(subprocess.run([binary, arch, ",".join(CAPS)], check=True,
                                            capture_output=True, text=True).stdout)
            for arch in ARCHES
        }


def applies(rule, arch):
    """Whether a containers-common rule applies to memwatch's container."""
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if inc.get("arches") and arch not in inc["arches"]:
        return False
    if exc.get("arches") and arch in exc["arches"]:
        return False
    if any(c not in CAPS for c in inc.get("caps") or []):
        return False
    if any(c in CAPS for c in exc.get("caps") or []):
        return False
    if inc.get("minKernel") or exc.get("minKernel"):
        raise SystemExit(f"minKernel is not handled: {rule}")
    return True


def norm_args(args):
    return tuple(sorted((a["index"], a["value"], a.get("valueTwo", 0), a["op"]) for a in args or []))


def normalize(rules):
    """{call: [(action, errnoRet, args)]}: rules that apply, one per call."""
    calls = {}
    for rule in rules:
        errno = rule.get("errnoRet")
        for name in rule["names"]:
            calls.setdefault(name, []).append((rule["action"], errno, norm_args(rule.get("args"))))
    return calls


def containers_common(default, arch):
    return normalize(r for r in default["syscalls"] if applies(r, arch))


def allows(rules):
    """None: refused; (): allowed whatever the arguments; else the argument
    rules (each a tuple of comparisons) under which it is allowed."""
    allowed = [args for action, _, args in rules if action == ALLOW]
    if not allowed:
        return None
    if () in allowed:
        return ()
    return tuple(sorted(set(allowed)))


def intersect(a, b):
    """One call's rules in both defaults: those of the narrower."""
    left, right = allows(a), allows(b)
    if left is None or right is None:
        refusals = [r for r in a + b if r[0] != ALLOW and not r[2]]
        return refusals[:1]
    if left == ():
        return b
    if right == ():
        return a
    return [(ALLOW, None, args) for args in left if args in right]


def rules_json(calls):
    """Rules grouped as the runtimes' files group them (same rules, one entry)."""
    groups = {}
    for name, rules in calls.items():
        for action, errno, args in rules:
            groups.setdefault((action, errno, args), []).append(name)
    out = []
    for (action, errno, args), names in sorted(groups.items(), key=lambda g: (g[0][0], str(g[0][1]), g[0][2])):
        rule = {"names": sorted(names), "action": action,
                "args": [{"index": i, "value": v, "valueTwo": v2, "op": op} for i, v, v2, op in args]}
        if errno is not None:
            rule["errnoRet"] = errno
        out.append(rule)
    return out


def derive(default, containerd):
    calls = {}
    for arch in ARCHES:
        mine = containers_common(default, arch)
        theirs = normalize(containerd[arch]["syscalls"])
        for name in sorted(set(mine) | set(theirs)):
            for rule in intersect(mine.get(name, []), theirs.get(name, [])):
                if rule not in calls.setdefault(name, []):
                    calls[name].append(rule)
    calls = {n: r for n, r in calls.items() if r and n not in ADDITIONS}
    for name in ADDITIONS:
        calls[name] = [(ALLOW, None, ())]
    return {
        "defaultAction": default["defaultAction"],
        "defaultErrnoRet": default["defaultErrnoRet"],
        "archMap": [a for a in default["archMap"] if a["architecture"] in ARCHES.values()],
        "syscalls": rules_json(calls),
    }


def arch_only(default, containerd):
    """Calls named only for some arches by a default: {call: arches}."""
    named = {}
    for rule in default["syscalls"]:
        for name in rule["names"]:
            named.setdefault(name, set()).update((rule.get("includes") or {}).get("arches") or ["*"])
    for arch in ARCHES:
        for name in normalize(containerd[arch]["syscalls"]):
            named.setdefault(name, set()).add(arch)
    common = set.intersection(*(set(normalize(c["syscalls"])) for c in containerd.values()))
    return {n: a for n, a in named.items() if "*" not in a and n not in common}


def verify(profile, default, containerd):
    """Every way the profile allows a call, each default allows it too, on
    each arch (bar ADDITIONS). Returns the violations, [] if none."""
    wrong = []
    if profile.get("defaultAction") == ALLOW:
        wrong.append("defaultAction allows every call")
    for rule in profile["syscalls"]:
        if rule.get("includes") or rule.get("excludes"):
            wrong.append(f"{rule['names']}: includes/excludes (containerd applies the rule regardless)")
        if rule["action"] not in (ALLOW, "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS"):
            wrong.append(f"{rule['names']}: action {rule['action']}")
    mine = normalize(profile["syscalls"])
    for name, rules in sorted(mine.items()):
        if allows(rules) is not None and any(r[0] != ALLOW and not r[2] for r in rules):
            wrong.append(f"{name}: both allowed and refused (runtimes refuse such a profile)")
    only = arch_only(default, containerd)
    for arch in ARCHES:
        runtimes = {"containers-common": containers_common(default, arch),
                    "containerd": normalize(containerd[arch]["syscalls"])}
        for name, rules in sorted(mine.items()):
            allowed = allows(rules)
            if allowed is None or name in ADDITIONS or arch not in only.get(name, {arch}):
                continue
            for runtime, calls in runtimes.items():
                theirs = allows(calls.get(name, []))
                if theirs is None:
                    wrong.append(f"{arch} {runtime}: {name} allowed, the default refuses it")
                elif theirs != () and (allowed == () or not set(allowed) <= set(theirs)):
                    wrong.append(f"{arch} {runtime}: {name} allowed for {allowed or 'any arguments'}, "
                                 f"the default only for {theirs}")
    return wrong


def main():
    usage = __doc__.split("\n\n")[1]
    if len(sys.argv) < 2 or sys.argv[1] not in ("derive", "verify"):
        sys.exit(usage)
    args = sys.argv[2:]
    if sys.argv[1] == "derive" and len(args) == 2:
        with open(args[0]) as f:
            default = json.load(f)
        json.dump(derive(default, containerd_defaults(args[1])), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif sys.argv[1] == "verify" and len(args) == 3:
        with open(args[0]) as f:
            profile = json.load(f)
        with open(args[1]) as f:
            default = json.load(f)
        wrong = verify(profile, default, containerd_defaults(args[2]))
        for line in wrong:
            print(line)
        print(f"{args[0]}: {len(wrong)} rules wider than a runtime default"
              f" (bar {', '.join(ADDITIONS)})")
        sys.exit(1 if wrong else 0)
    else:
        sys.exit(usage)


if __name__ == "__main__":
    main()
