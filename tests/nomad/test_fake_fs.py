"""The fake API's fs/ls and fs/cat read an allocation's files from the client simulator's
allocation directory, with the answers Nomad 2.0.5's source gives (command/agent/fs_endpoint.go,
client/fs_endpoint.go, client/allocdir/alloc_dir.go, helper/escapingfs/escapes.go)."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

from helpers import load_nomad_helper

fake_api = load_nomad_helper("fake_api")
sample_job = load_nomad_helper("sample_job")
client_sim = load_nomad_helper("client_sim")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode

SCRIPT = ('mkdir -p "$NOMAD_TASK_DIR/halo-logs/node-0/progress" && '
          'printf "7 1800000000.5\\n" > "$NOMAD_TASK_DIR/halo-logs/node-0/progress/rank-0" && '
          'echo shared > "$NOMAD_ALLOC_DIR/data/x" && echo no > "$NOMAD_SECRETS_DIR/token" && '
          'ln -s /etc "$NOMAD_TASK_DIR/out" && touch "$NOMAD_TASK_DIR/ready" && exec sleep 60')


def get(fake, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{fake.address}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def running(tmp_path):
    payload = sample_job.make_job(1, gpus=0, command=("sh", "-c", SCRIPT))
    fake = FakeNomad([FakeNode("a", gpus=0)])
    cluster = client_sim.SimCluster(payload["Job"], tmp_path / "nomad", host_env=dict(os.environ))
    return fake, cluster, payload


def started(fake, cluster, payload):
    fake.attach_sim(cluster)
    req = urllib.request.Request(f"{fake.address}/v1/jobs", data=json.dumps(payload).encode(), method="PUT")
    urllib.request.urlopen(req, timeout=10).close()
    alloc = fake.alloc_for("halo-test", "trainer[0]")
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(cluster.allocations[0].task_dir("torchrun"), "local", "ready")):
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.1)
    return alloc["ID"]


def test_ls_and_cat_read_the_allocation_directory(tmp_path):
    fake, cluster, payload = running(tmp_path)
    with fake, cluster:
        aid = started(fake, cluster, payload)
        code, body = get(fake, f"/v1/client/fs/ls/{aid}?path=torchrun/local/halo-logs/node-0/progress")
        assert code == 200, body
        (entry,) = json.loads(body)
        assert (entry["Name"], entry["IsDir"], entry["Size"]) == ("rank-0", False, 15)
        assert entry["FileMode"] == "-rw-r--r--" or entry["FileMode"].startswith("-rw")
        # No path lists the allocation directory itself: alloc/ and each task's directory.
        code, body = get(fake, f"/v1/client/fs/ls/{aid}")
        assert code == 200 and {e["Name"] for e in json.loads(body)} == {"alloc", "torchrun"}
        code, body = get(fake, f"/v1/client/fs/cat/{aid}?path=torchrun/local/halo-logs/node-0/progress/rank-0")
        assert (code, body) == (200, b"7 1800000000.5\n")
        assert get(fake, f"/v1/client/fs/cat/{aid}?path=/alloc/data/x") == (200, b"shared\n")


def test_missing_paths_escapes_and_secrets_answer_as_nomad_does(tmp_path):
    fake, cluster, payload = running(tmp_path)
    with fake, cluster:
        aid = started(fake, cluster, payload)
        # ls: "no such file or directory" is 404 (command/agent/fs_endpoint.go DirectoryListRequest).
        code, body = get(fake, f"/v1/client/fs/ls/{aid}?path=torchrun/local/nothing")
        assert code == 404 and b"no such file or directory" in body
        # cat: the file's Stat failing is 400 (client/fs_endpoint.go stream).
        code, body = get(fake, f"/v1/client/fs/cat/{aid}?path=torchrun/local/nothing")
        assert code == 400 and b"no such file or directory" in body
        code, body = get(fake, f"/v1/client/fs/cat/{aid}?path=torchrun/local")
        assert (code, body) == (400, b'file "torchrun/local" is a directory')
        assert get(fake, f"/v1/client/fs/cat/{aid}") == (400, b"must provide a file name")
        # A path climbing out of the allocation directory, by .. or by a symlink, is refused.
        for path in ("../..", "torchrun/../../x", "torchrun/local/out/passwd"):
            code, body = get(fake, f"/v1/client/fs/cat/{aid}?path={path}")
            assert (code, body) == (400, b"Path escapes the alloc directory"), path
        code, body = get(fake, f"/v1/client/fs/ls/{aid}?path=../")
        assert (code, body) == (500, b"Path escapes the alloc directory")
        code, body = get(fake, f"/v1/client/fs/ls/{aid}?path=torchrun/local/out")
        assert (code, body) == (500, b"Path escapes the alloc directory")
        # The task's secrets/ (alloc_dir.go ReadAt).
        code, body = get(fake, f"/v1/client/fs/cat/{aid}?path=torchrun/secrets/token")
        assert code == 500 and body.startswith(b"Reading secret file prohibited"), body
        # An allocation the servers do not know.
        assert get(fake, "/v1/client/fs/ls/0000?path=/")[0] == 404
        assert get(fake, "/v1/client/fs/cat/0000?path=x")[0] == 404
