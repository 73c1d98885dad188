"""A trainer rank that reads every HALO_SERVER_<NAME>_URLS it was given, GETs each URL, prints
what it got and writes --report-dir/rankR.json. --hold keeps it running (to kill a server)."""
import argparse
import json
import os
import time
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--report-dir", required=True)
p.add_argument("--hold", type=float, default=0.0)
args = p.parse_args()
started = time.time()
rank = int(os.environ["RANK"])
got = {}
for key, value in sorted(os.environ.items()):
    if key.startswith("HALO_SERVER_") and key.endswith("_URLS"):
        got[key] = []
        for url in value.split(","):
            with urllib.request.urlopen(url + f"/from-rank-{rank}", timeout=10) as r:
                body = json.loads(r.read())
            print(f"rank {rank}: {url} -> {body['server']}", flush=True)
            got[key].append({"url": url, "body": body})
os.makedirs(args.report_dir, exist_ok=True)
report = {"rank": rank, "started": started, "urls": got,
          "group_ports": {k: v for k, v in os.environ.items() if k.endswith("_GROUP_PORT")},
          "nccl_net": os.environ.get("NCCL_NET")}
with open(os.path.join(args.report_dir, f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
time.sleep(args.hold)
