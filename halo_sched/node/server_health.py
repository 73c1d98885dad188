"""Wait until every rollout server answers its health path (run on a trainer node by the entry
script, with the node's python3; standard library only).

argv: SECONDS then NAME URL pairs (NAME like ``vllm[0]``, URL the health URL). Exit 0 once each
URL answered HTTP 200; exit 1 at the deadline, naming every server that did not, with its last
error. Prints one line per server when it becomes healthy.
"""
import sys
import time
import urllib.error
import urllib.request


def main(argv):
    deadline = time.monotonic() + float(argv[0])
    pending = dict(zip(argv[1::2], argv[2::2]))
    last = {name: "no answer yet" for name in pending}
    t0 = time.monotonic()
    while pending:
        for name, url in list(pending.items()):
            left = deadline - time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=max(0.5, min(5.0, left))) as resp:
                    code = resp.status
            except urllib.error.HTTPError as err:
                code, last[name] = err.code, f"HTTP {err.code}"
            except (urllib.error.URLError, OSError, ValueError) as err:
                code, last[name] = None, str(getattr(err, "reason", err))
            if code == 200:
                del pending[name]
                print(f"halo-sched: server {name} healthy at {url} after {time.monotonic() - t0:.1f}s "
                      f"(t={time.time():.3f})", file=sys.stderr, flush=True)
            elif code is not None:
                last[name] = f"HTTP {code}"
        if not pending:
            break
        if time.monotonic() >= deadline:
            for name, url in pending.items():
                print(f"halo-sched: server {name} did not answer 200 at {url} within rendezvous.timeout_s "
                      f"(last: {last[name]})", file=sys.stderr, flush=True)
            return 1
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
