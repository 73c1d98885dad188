"""A stand-in rollout server: answers GET /health with 503 for --delay seconds, then 200; answers
any other GET with a JSON line naming itself, and appends every request it served to
--record-dir/NAME-INDEX.jsonl (time, path, client). --die-after ends it with exit 3. --env-hex NAME
puts the hex of NAME's value in its environment (a secret, in tests) into every answer."""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--record-dir", required=True)
p.add_argument("--die-after", type=float, default=None)
p.add_argument("--echo", default="")
p.add_argument("--env-hex", action="append", default=[])
args = p.parse_args()
start = time.time()
me = f"{os.environ.get('HALO_SERVER_NAME', '?')}-{os.environ.get('HALO_SERVER_INDEX', '?')}"
os.makedirs(args.record_dir, exist_ok=True)
record = os.path.join(args.record_dir, me + ".jsonl")
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        healthy = time.time() - start >= args.delay
        if self.path == "/health":
            code, body = (200, b"ok") if healthy else (503, b"starting")
        else:
            code = 200
            body = json.dumps({"server": me, "path": self.path, "pid": os.getpid(),
                               "echo_hex": args.echo.encode().hex(),
                               "master": os.environ.get("HALO_TRAINER_MASTER_ADDR"),
                               "nccl_net": os.environ.get("NCCL_NET"),
                               "env_hex": {n: os.environb.get(n.encode(), b"").hex() for n in args.env_hex}}).encode()
        with lock, open(record, "a") as f:
            f.write(json.dumps({"t": time.time(), "path": self.path, "code": code, "pid": os.getpid()}) + "\n")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


addr = os.environ.get("HALO_SERVER_ADDR") or "127.0.0.1"
srv = ThreadingHTTPServer((addr, args.port), Handler)
print(f"rollout server {me} on {addr}:{args.port} pid {os.getpid()}", flush=True)
if args.die_after is not None:
    def die():
        time.sleep(args.die_after)
        print(f"rollout server {me}: dying on purpose", flush=True)
        os._exit(3)
    threading.Thread(target=die, daemon=True).start()
srv.serve_forever()
