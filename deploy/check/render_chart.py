#!/usr/bin/env python3
"""Renders the memwatch Helm chart offline with Helm's own engine (the
helm-python-sdk wheel bundles Helm's Go SDK as libhelm_c), lints it, and
writes what it rendered: OUT/manifests.yaml (every document),
OUT/manifests.json (the same, parsed: a JSON list of objects, for tests) and
OUT/memwatch.toml (the agent config from the ConfigMap). Helm renders offline
here: `lookup` finds nothing and .Capabilities.APIVersions holds only the
built-in Kubernetes groups (as with `helm template`).

Usage: render_chart.py CHART_DIR OUT_DIR [VALUES_FILE]
"""
import json
import os
import sys

import helm_python as helm


def main() -> int:
    chart_dir, out_dir = sys.argv[1], sys.argv[2]
    values = {}
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            values = helm.values_from_yaml(f.read())
    lint = helm.lint(chart_dir, values=values) if values else helm.lint(chart_dir)
    print(f"helm lint: {lint}")
    if lint.get("errors") or any(m.get("severity", 0) >= 3 for m in lint.get("messages", [])):
        print("helm lint found errors", file=sys.stderr)
        return 1
    with helm.Chart.load(chart_dir) as chart:
        rendered = chart.render(values, name="memwatch", namespace="memwatch")
    os.makedirs(out_dir, exist_ok=True)
    docs = []
    toml = None
    for name, text in sorted(rendered.items()):
        if not name.endswith(".yaml") or not text.strip():
            continue
        docs.append(f"# Source: {name}\n{text.strip()}\n")
        if name.endswith("/configmap.yaml"):
            toml = config_from(text)
    with open(os.path.join(out_dir, "manifests.yaml"), "w") as f:
        f.write("---\n".join(docs))
    with open(os.path.join(out_dir, "manifests.json"), "w") as f:
        json.dump(parsed(docs), f, indent=1)
    if toml is None:
        print("no ConfigMap rendered", file=sys.stderr)
        return 1
    with open(os.path.join(out_dir, "memwatch.toml"), "w") as f:
        f.write(toml)
    print(f"rendered {len(docs)} manifests into {out_dir}")
    return 0


def parsed(docs: list) -> list:
    import yaml  # PyYAML, a dependency of kubernetes-validate

    return [d for text in docs for d in yaml.safe_load_all(text) if d]


def config_from(configmap_yaml: str) -> str:
    import yaml  # PyYAML, a dependency of kubernetes-validate

    return yaml.safe_load(configmap_yaml)["data"]["memwatch.toml"]


if __name__ == "__main__":
    sys.exit(main())
