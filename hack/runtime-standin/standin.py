#!/usr/bin/env python3
"""A stand-in for a model server (KServe ServingRuntime) and for vLLM (LLMInferenceService),
for the real-node tests: it reads the model files it is given and serves what it read.

    standin [--model_dir=DIR | --model-dir DIR] [--http_port=N | --port N] [...]
    vllm serve DIR [--port N] [--ssl-certfile F --ssl-keyfile F] [--lora-modules NAME=DIR ...]
    vllm --version

On start it prints one JSON line: {"event": "model-files", "model_dir": DIR, "files":
{relative path: sha256}, "lora": {NAME: {"dir": DIR, "files": {...}}}, "error": null or the
OSError}, then serves HTTP (HTTPS with --ssl-certfile) on the port (8080; vllm: 8000):
GET /health answers 200, GET /files the same document read again, GET /v1/models the served
names. Unknown options are ignored (a vLLM preset passes many); no network is used besides
the listening socket. Standard library only.
"""

import hashlib
import http.server
import json
import os
import ssl
import sys

VALUE_OPTIONS = {"--port", "--http_port", "--http-port", "--model_dir", "--model-dir",
                 "--ssl-certfile", "--ssl-keyfile", "--served-model-name"}


def parse(argv):
    opts, positional, lora = {}, [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            opts[key] = value
        elif arg == "--lora-modules":
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                spec = argv[i]
                if spec.startswith("{"):
                    doc = json.loads(spec)
                    lora[doc["name"]] = doc["path"]
                elif "=" in spec:
                    name, path = spec.split("=", 1)
                    lora[name] = path
                i += 1
            continue
        elif arg in VALUE_OPTIONS and i + 1 < len(argv):
            opts[arg] = argv[i + 1]
            i += 1
        elif not arg.startswith("-"):
            positional.append(arg)
        i += 1
    return opts, positional, lora


def digests(root):
    files = {}
    for d, _, names in os.walk(root):
        for name in names:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return dict(sorted(files.items()))


def read(model_dir, lora):
    doc = {"event": "model-files", "model_dir": model_dir, "files": {}, "lora": {}, "error": None}
    try:
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"no directory {model_dir}")
        doc["files"] = digests(model_dir)
        for name, path in sorted(lora.items()):
            doc["lora"][name] = {"dir": path, "files": digests(path)}
    except OSError as exc:
        doc["error"] = str(exc)
    return doc


def main():
    prog = os.path.basename(sys.argv[0])
    argv = sys.argv[1:]
    if prog == "vllm":
        if "--version" in argv:
            print("standin")  # not a version: a preset adds no version-gated options
            return 0
        if argv[:1] != ["serve"]:
            print(f"vllm stand-in: only `serve` and `--version`, not {argv}", file=sys.stderr)
            return 2
        argv = argv[1:]
    opts, positional, lora = parse(argv)
    default_dir = positional[0] if prog == "vllm" and positional else "/mnt/models"
    model_dir = opts.get("--model_dir") or opts.get("--model-dir") or default_dir
    port = int(opts.get("--port") or opts.get("--http_port") or opts.get("--http-port")
               or (8000 if prog == "vllm" else 8080))
    names = [opts.get("--served-model-name") or os.path.basename(model_dir.rstrip("/"))]
    print(json.dumps(read(model_dir, lora), sort_keys=True), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                body = b"ok"
            elif self.path == "/files":
                body = json.dumps(read(model_dir, lora), sort_keys=True).encode()
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": n} for n in names]}).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            pass

    server = http.server.ThreadingHTTPServer(("", port), Handler)
    if opts.get("--ssl-certfile"):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(opts["--ssl-certfile"], opts.get("--ssl-keyfile"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(json.dumps({"event": "serving", "port": port}), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
