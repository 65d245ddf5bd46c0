#!/usr/bin/env python3
"""Renders the memwatch Helm chart with Helm's own engine (the
helm-python-sdk wheel bundles Helm's Go SDK as libhelm_c), lints it, and
writes what it rendered: OUT/manifests.yaml (every document),
OUT/manifests.json (the same, parsed: a JSON list of objects, for tests) and
OUT/memwatch.toml (the agent config from the ConfigMap).

By default Helm renders offline, as `helm template` does: `lookup` finds
nothing and .Capabilities.APIVersions holds only the built-in Kubernetes
groups. --api-versions adds API versions to it, as `helm template
--api-versions` does (e.g. monitoring.coreos.com/v1/ServiceMonitor).
--cluster SECRETS.json renders an upgrade against a stub Kubernetes API
server started here on loopback, which answers discovery of v1 and GET of
the Secrets in the file ({"name": {"key": "base64 value"}}, in the
release namespace) and 404 to everything else: `lookup` then finds those
Secrets, as it would the release's own in a cluster.

Usage: render_chart.py [--api-versions V[,V...]] [--cluster SECRETS.json]
                       CHART_DIR OUT_DIR [VALUES_FILE]
"""
import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import helm_python as helm
from helm_python import _native

RELEASE = "memwatch"
NAMESPACE = "memwatch"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-versions", default="")
    parser.add_argument("--cluster")
    parser.add_argument("chart_dir")
    parser.add_argument("out_dir")
    parser.add_argument("values_file", nargs="?")
    args = parser.parse_args()
    chart_dir, out_dir = args.chart_dir, args.out_dir
    values = {}
    if args.values_file:
        with open(args.values_file) as f:
            values = helm.values_from_yaml(f.read())
    lint = helm.lint(chart_dir, values=values) if values else helm.lint(chart_dir)
    print(f"helm lint: {lint}")
    if lint.get("errors") or any(m.get("severity", 0) >= 3 for m in lint.get("messages", [])):
        print("helm lint found errors", file=sys.stderr)
        return 1
    api_versions = [v for v in args.api_versions.split(",") if v]
    with helm.Chart.load(chart_dir) as chart:
        if args.cluster:
            with open(args.cluster) as f:
                secrets = json.load(f)
            rendered = render_against_stub(chart, values, secrets)
        elif api_versions:
            # Chart.render has no keyword for it; the library takes the
            # option (and refuses unknown ones).
            opts = {"name": RELEASE, "namespace": NAMESPACE, "api_versions": api_versions}
            rendered = json.loads(
                _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
            )
        else:
            rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
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


def render_against_stub(chart, values, secrets: dict) -> dict:
    """An upgrade's render, its `lookup` answered by a stub API server."""
    prefix = f"/api/v1/namespaces/{NAMESPACE}/secrets/"

    class Api(BaseHTTPRequestHandler):
        def log_message(self, *_args):
            pass

        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/api/v1":
                secret = {"name": "secrets", "singularName": "secret", "namespaced": True,
                          "kind": "Secret", "verbs": ["get", "list"]}
                return self.reply(200, {"kind": "APIResourceList", "groupVersion": "v1",
                                        "resources": [secret]})
            name = path[len(prefix):] if path.startswith(prefix) else None
            if name in secrets:
                return self.reply(200, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                        "metadata": {"name": name, "namespace": NAMESPACE},
                                        "data": secrets[name]})
            self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": "NotFound", "code": 404})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with helm.Config(kube_apiserver=url, namespace=NAMESPACE) as config:
            return config.render(chart, values, name=RELEASE, namespace=NAMESPACE,
                                 is_upgrade=True)
    finally:
        server.shutdown()


def parsed(docs: list) -> list:
    import yaml  # PyYAML, a dependency of kubernetes-validate

    return [d for text in docs for d in yaml.safe_load_all(text) if d]


def config_from(configmap_yaml: str) -> str:
    import yaml  # PyYAML, a dependency of kubernetes-validate

    return yaml.safe_load(configmap_yaml)["data"]["memwatch.toml"]


if __name__ == "__main__":
    sys.exit(main())
