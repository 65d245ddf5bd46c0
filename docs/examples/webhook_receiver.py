#!/usr/bin/env python3
"""A memwatch webhook receiver: verifies Standard Webhooks signatures and
reads both body formats. Python 3 standard library only.

    MEMWATCH_WEBHOOK_SECRET=whsec_... python3 webhook_receiver.py --port 8080

The secret is the `[[webhook]] secret` of memwatch's configuration: a
`whsec_<base64>` secret is the base64-decoded key, any other string its own
bytes (the same rule memwatch applies). Without a secret, requests are not
verified.

A request is taken (204) when:
  - `webhook-timestamp` is within TOLERANCE seconds of now (replays of old
    requests are refused), and
  - one `v1,<base64>` entry of `webhook-signature` (space-separated) equals
    HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{raw body}"),
    compared in constant time, on the raw body bytes before any parsing.
Anything else is refused with 401 (memwatch then parks the batch: fix the
secret and restart the agent to have it sent again) or 400 (a body that
does not parse).

Both formats are read: `application/json` is a JSON array of memwatch
events; `application/cloudevents-batch+json` is a JSON array of CloudEvents
1.0 whose `data` is the memwatch event. Deliveries are at least once:
dedupe by the event's `id` (a CloudEvent's `id` is the same).

For each request one JSON line goes to stdout: the verdict, the format, the
batch's id and the events (id, seq, kind). `--port 0` picks a free port; the
first line printed is `listening <port>`.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

# Seconds a request's timestamp may be away from the receiver's clock.
TOLERANCE = 5 * 60
SECRET_PREFIX = "whsec_"


def signing_key(secret):
    """The HMAC key of a memwatch webhook secret."""
    if secret.startswith(SECRET_PREFIX):
        encoded = secret[len(SECRET_PREFIX):]
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    return secret.encode()


def verify(key, headers, body, now=None):
    """None when the request is genuine and fresh, else why not."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        sent = int(timestamp)
    except ValueError:
        return "webhook-timestamp is not a number"
    now = time.time() if now is None else now
    if abs(now - sent) > TOLERANCE:
        return "webhook-timestamp is outside the tolerance"
    signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    for entry in signatures.split(" "):
        version, _, value = entry.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return None
    return "no signature matches"


def events_of(content_type, body):
    """The memwatch events of a body, and its format."""
    items = json.loads(body)
    if not isinstance(items, list):
        raise ValueError("the body is not a JSON array")
    media = content_type.split(";")[0].strip().lower()
    if media == "application/cloudevents-batch+json":
        events = []
        for ce in items:
            if ce.get("specversion") != "1.0":
                raise ValueError("not a CloudEvent 1.0")
            if not ce.get("type", "").startswith("io.memwatch."):
                raise ValueError("not a memwatch CloudEvent")
            event = ce["data"]
            if event["id"] != ce["id"] or ce["type"] != "io.memwatch." + event["kind"]:
                raise ValueError("a CloudEvent does not match its data")
            events.append(event)
        return events, "cloudevents"
    if media == "application/json":
        return items, "memwatch"
    raise ValueError("unexpected Content-Type " + content_type)


def handler(key):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            verdict = {"webhook_id": self.headers.get("webhook-id")}
            problem = verify(key, self.headers, body) if key is not None else None
            status = 204
            if problem is not None:
                verdict.update(verified=False, error=problem)
                status = 401
            else:
                verdict["verified"] = key is not None
                try:
                    events, verdict["format"] = events_of(
                        self.headers.get("Content-Type", ""), body)
                    verdict["events"] = [
                        {"id": e["id"], "seq": e["seq"], "kind": e["kind"]} for e in events]
                except (ValueError, KeyError, TypeError) as e:
                    verdict["error"] = "bad body: %s" % e
                    status = 400
            print(json.dumps(verdict), flush=True)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass  # stdout carries the verdicts only

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--secret-file", help="file holding the secret "
                        "(else the environment's MEMWATCH_WEBHOOK_SECRET)")
    args = parser.parse_args()
    secret = os.environ.get("MEMWATCH_WEBHOOK_SECRET")
    if args.secret_file:
        with open(args.secret_file) as f:
            secret = f.read().strip()
    key = signing_key(secret) if secret else None
    server = HTTPServer((args.host, args.port), handler(key))
    print("listening %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
