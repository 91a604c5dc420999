"""Remote pinning against its peers, same client and same server in the same run.

Prints ratios, not pass/fail (run: ``python benchmarks/remote_pinning.py``):

1. Pinning N objects of an unversioned S3 bucket (``manifest.data.remote``,
   listing mode, which pages ``ListObjectsV2``) against a bare paginated
   ``ListObjectsV2`` with the same client (boto3), each in a fresh child
   process: wall time ratio (target ≥ 0.9× the bare listing's speed), the
   child's peak RSS at 10k and 100k objects (flat: the pins stream to the
   store), and object GETs seen by the server (must be 0).
2. ``--deep`` against downloading every object with the client's own
   transfer manager (8 threads) to local disk and hashing that with
   ``manifest hash``: wall time ratio, and whether the roots are equal.

The server is moto's ThreadedMotoServer in this process (populated directly
through its backend, so filling 100k objects takes seconds); every request is
counted by method and path.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.remote_fixtures import S3_ENV, MotoS3

CHILD_PIN = """
import json, resource, sys, time
from pathlib import Path
from manifest.store import BlobStore
from manifest.data.remote import pin_dataset
import boto3  # imported before the clock starts, as in the bare child
store = BlobStore(Path(sys.argv[2])); store.ensure()
t = time.perf_counter()
ds = pin_dataset("d", sys.argv[1], store=store, mode=sys.argv[3])
print(json.dumps({"s": time.perf_counter() - t, "files": ds.files, "root": ds.root,
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

CHILD_BARE = """
import json, resource, sys, time
import boto3
from botocore.config import Config
client = boto3.session.Session().client("s3", config=Config(
    retries={"mode": "standard", "max_attempts": 8}, max_pool_connections=32))
t = time.perf_counter()
n = 0
for page in client.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[1],
                                                              Prefix=sys.argv[2]):
    n += len(page.get("Contents", ()))
print(json.dumps({"s": time.perf_counter() - t, "files": n,
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

CHILD_DOWNLOAD = """
import json, sys, time, concurrent.futures, os
from pathlib import Path
import boto3
from manifest.data.digest import digest_path
client = boto3.session.Session().client("s3")
bucket, prefix, dest = sys.argv[1], sys.argv[2], Path(sys.argv[3])
t = time.perf_counter()
keys = [o["Key"] for p in client.get_paginator("list_objects_v2").paginate(
    Bucket=bucket, Prefix=prefix) for o in p.get("Contents", ())]
def get(key):
    target = dest / key[len(prefix):]
    target.parent.mkdir(parents=True, exist_ok=True)
    client.download_file(bucket, key, str(target))
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    list(pool.map(get, keys))
root = digest_path(dest, cache=None).root
print(json.dumps({"s": time.perf_counter() - t, "root": root}))
"""


REPEATS = int(os.environ.get("REPEATS", "3"))


def _child(code: str, *args: str, env: dict[str, str]) -> dict[str, float | int | str]:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _fill(bucket: str, prefix: str, count: int, body: bytes) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID  # type: ignore[attr-defined]
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(bucket, "us-east-1")
    for i in range(count):
        backend.put_object(bucket, f"{prefix}{i // 1000:04d}/{i:07d}.bin", body)


def main() -> None:
    server = MotoS3()
    env = dict(os.environ, **S3_ENV, AWS_ENDPOINT_URL_S3=server.endpoint)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        env.pop(name, None)
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    print(f"server: moto (in process) at {server.endpoint}; client: boto3, one child each; "
          f"best of {REPEATS}, interleaved")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp:
        for count in (10_000, 100_000):
            bucket = f"bench-{count}"
            started = time.perf_counter()
            _fill(bucket, "data/", count, b"x" * 64)
            print(f"\n{count:,} objects (filled in {time.perf_counter() - started:.1f} s)")
            # Interleaved, best of REPEATS each: a shared machine's load hits both alike.
            bare: list[dict[str, float | int | str]] = []
            pins: list[dict[str, float | int | str]] = []
            gets = 0
            for i in range(REPEATS):
                bare.append(_child(CHILD_BARE, bucket, "data/", env=env))
                server.log.clear()
                pins.append(_child(CHILD_PIN, f"s3://{bucket}/data",
                                   f"{tmp}/store-{count}-{i}", "listing", env=env))
                gets += server.log.object_gets(bucket)
            b = min(float(r["s"]) for r in bare)
            p = min(float(r["s"]) for r in pins)
            assert all(r["files"] == count for r in bare + pins)
            print(f"  bare ListObjectsV2 pages:      {b:7.2f} s   peak RSS "
                  f"{max(int(r['rss_kb']) for r in bare) / 1024:6.1f} MiB")
            print(f"  manifest pin (listing):        {p:7.2f} s   peak RSS "
                  f"{max(int(r['rss_kb']) for r in pins) / 1024:6.1f} MiB")
            print(f"  speed vs bare listing: {b / p:.2f}x   object GETs: {gets}")

        count, size = 200, 1 << 20
        _fill("bench-deep", "data/", count, os.urandom(size))
        print(f"\n--deep: {count} objects of {size >> 20} MiB")
        deep = _child(CHILD_PIN, "s3://bench-deep/data", f"{tmp}/store-deep", "deep", env=env)
        down = _child(CHILD_DOWNLOAD, "bench-deep", "data/", f"{tmp}/mirror", env=env)
        print(f"  manifest --deep:                     {float(deep['s']):6.2f} s")
        print(f"  boto3 download (8 threads) + hash:   {float(down['s']):6.2f} s")
        print(f"  speed vs download+hash: {float(down['s']) / float(deep['s']):.2f}x   "
              f"roots equal: {deep['root'] == down['root']}")
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    server.server.stop()


if __name__ == "__main__":
    main()
