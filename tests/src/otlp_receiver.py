#!/usr/bin/env python3
"""An independent OTLP logs receiver for memwatch's OpenTelemetry sink tests.

Built on the official OpenTelemetry protocol definitions as Python ships them
(PyPI's opentelemetry-proto, with grpcio and protobuf), not on any Rust code:
it serves OTLP/gRPC (opentelemetry.proto.collector.logs.v1.LogsService/Export)
and OTLP/HTTP (POST /v1/logs, application/x-protobuf) on 127.0.0.1.

Every log record it takes is written to --out as one JSON line:
  {"protocol": "grpc"|"http", "authorization": <header or null>,
   "resource": {attr: value}, "scope": {"name", "version"},
   "record": {"time_unix_nano", "observed_time_unix_nano", "severity_number",
              "severity_text", "body", "event_name", "attributes": {attr: value}}}
While the file <--control>/unavailable exists it takes nothing: gRPC answers
UNAVAILABLE and HTTP 503, each such answer a line in <--control>/refused.
"""

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

PROTOBUF = "application/x-protobuf"


def any_value(value):
    """An AnyValue as plain JSON (int, float, bool, string; nested as lists/dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(key_values):
    out = {}
    for kv in key_values:
        if kv.key in out:
            raise ValueError(f"attribute {kv.key} twice")
        out[kv.key] = any_value(kv.value)
    return out


class Receiver:
    def __init__(self, out, control):
        self.out = open(out, "a", encoding="utf-8")
        self.control = control
        self.lock = threading.Lock()

    def unavailable(self, protocol):
        if not os.path.exists(os.path.join(self.control, "unavailable")):
            return False
        with self.lock, open(os.path.join(self.control, "refused"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"protocol": protocol}) + "\n")
        return True

    def take(self, protocol, request, authorization):
        lines = []
        for resource_logs in request.resource_logs:
            resource = attributes(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                scope = {"name": scope_logs.scope.name, "version": scope_logs.scope.version}
                for r in scope_logs.log_records:
                    record = {
                        "time_unix_nano": r.time_unix_nano,
                        "observed_time_unix_nano": r.observed_time_unix_nano,
                        "severity_number": r.severity_number,
                        "severity_text": r.severity_text,
                        "body": any_value(r.body),
                        "event_name": r.event_name,
                        "attributes": attributes(r.attributes),
                    }
                    lines.append(json.dumps({
                        "protocol": protocol,
                        "authorization": authorization,
                        "resource": resource,
                        "scope": scope,
                        "record": record,
                    }))
        with self.lock:
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()


class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, receiver):
        self.receiver = receiver

    def Export(self, request, context):
        if self.receiver.unavailable("grpc"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "told to be unavailable")
        metadata = dict(context.invocation_metadata())
        self.receiver.take("grpc", request, metadata.get("authorization"))
        return logs_service_pb2.ExportLogsServiceResponse()


def http_handler(receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body=b"", content_type="text/plain"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/logs":
                return self.answer(404, b"not found")
            if self.headers.get("Content-Type") != PROTOBUF:
                return self.answer(415, b"protobuf only")
            if receiver.unavailable("http"):
                return self.answer(503, b"told to be unavailable")
            request = logs_service_pb2.ExportLogsServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as e:  # a malformed body is the sender's fault
                return self.answer(400, str(e).encode())
            receiver.take("http", request, self.headers.get("Authorization"))
            response = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
            self.answer(200, response, PROTOBUF)

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--control", required=True)
    args = parser.parse_args()
    receiver = Receiver(args.out, args.control)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(receiver), server)
    if server.add_insecure_port(f"127.0.0.1:{args.grpc_port}") == 0:
        sys.exit(f"cannot listen on gRPC port {args.grpc_port}")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", args.http_port), http_handler(receiver))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=http.shutdown).start())
    try:
        http.serve_forever()
    finally:
        server.stop(0)


if __name__ == "__main__":
    main()
