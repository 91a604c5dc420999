"""Credentials for buckets and the Hub never reach a byte the tool writes.

Fresh values are planted where a user keeps them: the S3 endpoint URL's
userinfo (``AWS_ENDPOINT_URL_S3=http://USER:PASS@host``), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, the service-account file that
``GOOGLE_APPLICATION_CREDENTIALS`` names, ``HF_TOKEN``, and the error text of
providers that echo them (a denied request whose message repeats a presigned
URL, the session token, the secret, the Hub token). Then capture (S3 against
moto, GCS against its emulator, a Hub dataset against a local Hub API), show,
diff, ``verify --no-rerun``, a full verify, and a verify whose re-check meets
a failing Hub; every manifest, every blob in the store (pins and listings),
the user data directory, every stdout/stderr and every report is scanned for
each planted value.

Positive controls, so the scan could fail: moto receives the access key id in
each request's ``Authorization`` and the session token in
``X-Amz-Security-Token``, and each request's SigV4 signature verifies with the
planted secret (and not with another); the endpoint with userinfo is the one
the requests reached; the Hub API receives ``Bearer HF_TOKEN``; the training
script reads the service-account file; each hostile error text, as the
provider's client reports it, holds the planted values.

What the emulators cannot show: gcp-storage-emulator is reached with anonymous
credentials (the client skips Application Default Credentials when
``STORAGE_EMULATOR_HOST`` is set), so the service-account file is never read by
the tool here; its content is planted in the file and in a provider error.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.remote_fixtures import (  # noqa: F401
    MotoS3,
    gcs_emulator_fixture,
    moto_server_fixture,
    s3_fixture,
)
from tests.runs import make_repo, manifest_cli

pytestmark = [
    pytest.mark.slow,
    # ray's extra brings grpcio without grpcio-status; google-api-core warns on import.
    pytest.mark.filterwarnings("ignore:Please install grpcio-status:ImportWarning"),
]

COMMIT = "c" * 40


def _planted() -> dict[str, str]:
    return {
        "akid": "AKIA" + secrets.token_hex(8).upper(),
        "secret": secrets.token_urlsafe(30)[:40],
        "session": "FwoGZX" + secrets.token_urlsafe(60),
        "ep_user": "epuser" + secrets.token_hex(6),
        "ep_pass": "EpPass" + secrets.token_hex(10),
        "hf": "hf_" + secrets.token_hex(17),
        "gcp_key_id": secrets.token_hex(20),
        "gcp_key": secrets.token_urlsafe(48),
        "amz_sig": secrets.token_hex(32),
        "goog_sig": secrets.token_hex(64),
    }


class _Hub(http.server.BaseHTTPRequestHandler):
    """The Hub API for one dataset; ``failing`` turns every answer into an error that
    echoes the caller's token and a signed URL, as a misbehaving proxy would."""

    auth: ClassVar[list[str]] = []
    failing: ClassVar[str | None] = None

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        _Hub.auth.append(self.headers.get("Authorization", ""))
        path = self.path.split("?")[0]
        if _Hub.failing is not None:
            self.send_response(400)
            self.send_header("X-Error-Message", _Hub.failing)
            self.send_header("Content-Type", "application/json")
            body = json.dumps({"error": _Hub.failing}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path in ("/api/datasets/org/set/revision/main",
                    f"/api/datasets/org/set/revision/{COMMIT}"):
            body = json.dumps({"id": "org/set", "sha": COMMIT}).encode()
        elif path.startswith(f"/api/datasets/org/set/tree/{COMMIT}"):
            body = json.dumps([{"type": "file", "oid": "1" * 40, "size": 5,
                                "path": "a.txt"}]).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An S3-compatible or GCS endpoint that refuses every request with a message
    echoing what it was given: a presigned URL, the session token, the secret."""

    message: ClassVar[str] = ""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        if self.path.startswith("/storage/v1"):  # GCS JSON API
            body = json.dumps({"error": {"code": 400, "message": _Hostile.message,
                                         "errors": [{"message": _Hostile.message}]}}).encode()
            kind = "application/json"
        else:  # S3 REST: an error code the tool has no sentence of its own for
            from xml.sax.saxutils import escape

            body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidRequest"
                    f"</Code><Message>{escape(_Hostile.message)}</Message></Error>").encode()
            kind = "application/xml"
        self.send_response(400)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = _answer


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    yield from _serve(_Hub)


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    yield from _serve(_Hostile)


JOB = '''
import hashlib, os
seen = [os.environ.get(k, "") for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN", "HF_TOKEN", "AWS_ENDPOINT_URL_S3")]
with open(os.environ["GOOGLE_APPLICATION_CREDENTIALS"]) as fh:
    seen.append(fh.read())
os.makedirs("out", exist_ok=True)
with open("out/seen.txt", "w") as fh:
    fh.write(hashlib.sha256("\\0".join(seen).encode()).hexdigest())
with open("out/model.txt", "w") as fh:
    fh.write("weights\\n")
'''


def _signature_verifies(headers: dict[str, str], method: str, url: str, secret: str,
                        akid: str, token: str) -> bool:
    """Recompute the SigV4 signature of a logged request with ``secret``."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    authorization = headers["authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    sent = authorization.split("Signature=")[1].strip()
    request = AWSRequest(method=method, url=url,
                         headers={name: headers[name] for name in signed})
    request.context["timestamp"] = headers["x-amz-date"]
    auth = S3SigV4Auth(Credentials(akid, secret, token), "s3", "us-east-1")
    canonical = auth.canonical_request(request)
    return bool(auth.signature(auth.string_to_sign(request, canonical), request) == sent)


def _written(*roots: Path) -> bytes:
    return b"\0".join(p.read_bytes() for root in roots for p in sorted(root.rglob("*"))
                      if p.is_file() and not p.is_symlink())


def test_no_remote_credential_reaches_any_written_byte(
        s3: MotoS3, gcs_emulator: str, hub: str, hostile: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    s = _planted()
    # ---- the credentials, where the standard chains look for them
    host = s3.endpoint.removeprefix("http://")
    endpoint = f"http://{s['ep_user']}:{s['ep_pass']}@{host}"
    service_account = tmp_path / "keys" / "service-account.json"
    service_account.parent.mkdir()
    service_account.write_text(json.dumps({
        "type": "service_account", "project_id": "p", "private_key_id": s["gcp_key_id"],
        "private_key": f"-----BEGIN PRIVATE KEY-----\n{s['gcp_key']}\n-----END PRIVATE KEY-----\n",
        "client_email": "sa@p.iam.gserviceaccount.com", "token_uri": f"{hub}/token"}))
    for name, value in (("AWS_ACCESS_KEY_ID", s["akid"]), ("AWS_SECRET_ACCESS_KEY", s["secret"]),
                        ("AWS_SESSION_TOKEN", s["session"]), ("AWS_ENDPOINT_URL_S3", endpoint),
                        ("GOOGLE_APPLICATION_CREDENTIALS", str(service_account)),
                        ("HF_TOKEN", s["hf"]), ("HF_ENDPOINT", hub),
                        ("HF_HUB_DISABLE_TELEMETRY", "1"), ("HF_HOME", str(tmp_path / "hf")),
                        ("STORAGE_EMULATOR_HOST", gcs_emulator)):
        monkeypatch.setenv(name, value)
    planted = list(s.values())

    # ---- data in each place
    client = s3.client()
    client.create_bucket(Bucket="secret-scan")
    client.put_bucket_versioning(Bucket="secret-scan",
                                 VersioningConfiguration={"Status": "Enabled"})
    for key in ("data/a.bin", "data/b.bin"):
        client.put_object(Bucket="secret-scan", Key=key, Body=key.encode())
    gcs = storage.Client(project="t", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    gcs.bucket("gcs-data").blob("scan/x.bin").upload_from_string(b"x")

    repo = make_repo(tmp_path / "repo", {"job.py": JOB}, example=False)
    data = ["--data", "s3://secret-scan/data", "--data", "gs://gcs-data/scan",
            "--data", "hf://datasets/org/set@main"]
    outputs: list[bytes] = []

    def run(*args: str, expect: tuple[int, ...] = (0,), env: dict[str, str] | None = None,
            ) -> bytes:
        proc = manifest_cli(*args, cwd=repo, env=env)
        assert proc.returncode in expect, (args, proc.stderr.decode())
        outputs.extend((proc.stdout, proc.stderr))
        return proc.stdout

    s3.log.clear()
    _Hub.auth.clear()
    (repo / "ok.json").write_bytes(run("capture", "--artifact", "out/model.txt", *data, "--",
                                       "python", "job.py"))
    # Positive controls: the credentials reached the servers and the run.
    logged = list(zip(s3.log.requests, s3.log.headers, strict=True))
    assert logged
    for (method, path, query), headers in logged:
        assert f"Credential={s['akid']}/" in headers["authorization"]
        assert headers["x-amz-security-token"] == s["session"]
        url = f"{s3.endpoint}{path}" + (f"?{query}" if query else "")
        assert _signature_verifies(headers, method, url, s["secret"], s["akid"], s["session"])
        assert not _signature_verifies(headers, method, url, s["secret"] + "x", s["akid"],
                                       s["session"])
    assert f"Bearer {s['hf']}" in _Hub.auth
    seen = [s["akid"], s["secret"], s["session"], s["hf"], endpoint,
            service_account.read_text()]
    assert (repo / "out" / "seen.txt").read_text() == \
        hashlib.sha256("\0".join(seen).encode()).hexdigest()
    doc = json.loads((repo / "ok.json").read_bytes())
    # (The service-account file the script opened is discovered as an input: digested.)
    remote = [d["remote"] for d in doc["data"] if "remote" in d]
    assert [pin["provider"] for pin in remote] == ["s3", "gcs", "hf"]
    assert remote[0]["endpoint"] == s3.endpoint  # recorded without userinfo

    # A second run after an object changed, so diff and verify have changes to report.
    client.put_object(Bucket="secret-scan", Key="data/b.bin", Body=b"changed")
    (repo / "two.json").write_bytes(run("capture", "--artifact", "out/model.txt", *data, "--",
                                        "python", "job.py"))
    for verb in (["show", "ok.json"], ["diff", "ok.json", "two.json"],
                 ["diff", "--json", "ok.json", "two.json"], ["verify", "--no-rerun", "ok.json"]):
        run(*verb, expect=(0, 1))
    full = json.loads(run("verify", "--json", "ok.json", expect=(0, 1, 3)))
    assert any("b.bin" in line for change in full["data"] for line in change["files"])
    run("verify", "--json", "two.json", expect=(0,))

    # ---- providers whose error text echoes the credentials
    presigned = (f"https://secret-scan.s3.amazonaws.com/data/a.bin?X-Amz-Algorithm=AWS4-HMAC-"
                 f"SHA256&X-Amz-Credential={s['akid']}%2F20260101%2Fus-east-1%2Fs3%2Faws4_"
                 f"request&X-Amz-Security-Token={s['session']}&X-Amz-Signature={s['amz_sig']}")
    signed_gcs = (f"https://storage.googleapis.com/gcs-data/scan/x.bin?X-Goog-Algorithm=GOOG4-"
                  f"RSA-SHA256&X-Goog-Credential=sa%40p.iam.gserviceaccount.com&X-Goog-"
                  f"Signature={s['goog_sig']}")
    _Hostile.message = (f"request {presigned} denied for {s['akid']} with token "
                        f"{s['session']} and secret {s['secret']}; see {signed_gcs} "
                        f"(key {s['gcp_key_id']}: {s['gcp_key']})")
    hostile_host = hostile.removeprefix("http://")
    hostile_env = {"AWS_ENDPOINT_URL_S3": f"http://{s['ep_user']}:{s['ep_pass']}@{hostile_host}",
                   "STORAGE_EMULATOR_HOST": hostile, "AWS_MAX_ATTEMPTS": "1"}
    # Positive control: the client's own error holds the planted values.
    import boto3
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as echoed:
        boto3.client("s3", endpoint_url=hostile).list_objects_v2(Bucket="secret-scan")
    assert s["amz_sig"] in str(echoed.value) and s["secret"] in str(echoed.value)
    for url in ("s3://secret-scan/data", "gs://gcs-data/scan"):
        proc = manifest_cli("capture", "--data", url, "--", "python", "job.py", cwd=repo,
                            env=hostile_env)
        assert proc.returncode == 2, proc.stderr.decode()
        assert proc.stderr.decode().startswith(f"manifest: cannot list {url}/: ")
        outputs.extend((proc.stdout, proc.stderr))
    _Hub.failing = (f"token {s['hf']} refused for {presigned}; session {s['session']}; "
                    f"key {s['gcp_key']}")
    try:
        from huggingface_hub import HfApi

        with pytest.raises(Exception) as hub_echo:  # noqa: PT011 (whatever the client raises)
            HfApi(endpoint=hub).dataset_info("org/set", revision=COMMIT)
        assert s["hf"] in str(hub_echo.value)
        # verify's re-check meets the failing Hub: one line in the report, no secret.
        report = json.loads(run("verify", "--json", "ok.json", expect=(0, 1, 3)))
        # A dataset that could not be re-checked is "not checked", its reason in the detail.
        lines = [line for change in report["data"]
                 for line in [*change["files"], change.get("detail") or ""]]
        assert any("not checked: cannot look up" in line or "not checked: cannot list" in line
                   for line in lines), lines
        run("verify", "--no-rerun", "ok.json", expect=(0, 1, 3))
    finally:
        _Hub.failing = None

    xdg = Path(os.environ["XDG_DATA_HOME"])
    blob = b"\0".join([*outputs, _written(repo / ".manifest", xdg),
                       (repo / "ok.json").read_bytes(), (repo / "two.json").read_bytes()])
    assert b"blake3:" in blob  # positive control: the scan sees the records
    leaked = {name: value for name, value in s.items() if value.encode() in blob}
    assert leaked == {}, leaked
    assert len(planted) == 10
