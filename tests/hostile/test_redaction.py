"""Secrets never reach a byte the tool writes, and a redacted command still re-runs.

Every credential form from issue 10 is planted as a fresh random value; the
manifest, every blob in the store, the stderr of capture/show/diff/verify and
verify's JSON report are scanned for each one. Positive controls: the child
really received every value (it writes a digest of its argv, which the test
recomputes from the original argv), and a re-run with the values supplied as
``MANIFEST_SECRET_N`` reproduces the output bit for bit, while one without
them is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import pytest

from manifest.redact import (
    MissingSecretsError,
    Redactor,
    is_secret_file,
    redact_argv,
    redact_text,
    restore_argv,
    strip_url_credentials,
)
from tests.runs import make_repo, manifest_cli


def _alnum(n: int) -> str:
    return secrets.token_hex(n)[:n]


def _planted() -> dict[str, str]:
    """One fresh value per form (shapes that need a prefix get it)."""
    return {
        "token": "T" + _alnum(14), "url": "U" + _alnum(14), "db": "D" + _alnum(14),
        "query": "Q" + _alnum(14), "wandb": "W" + _alnum(14), "key": "K" + _alnum(14),
        "aws": "AKIA" + secrets.token_hex(8).upper(), "private": "P" + _alnum(14),
        "creds": "C" + _alnum(14), "pat": "github_pat_" + _alnum(24), "bearer": "B" + _alnum(14),
        "hf": "hf_" + _alnum(30), "ghp": "ghp_" + _alnum(36), "sk": "sk-" + _alnum(32),
        "xox": "xoxb-" + _alnum(20), "mysql": "M" + _alnum(14), "envvar": "E" + _alnum(14),
        "sig": "S" + _alnum(14), "hydra": "H" + _alnum(14),
    }


def _argv(s: dict[str, str]) -> list[str]:
    return [
        "env", f"HF_TOKEN={s['envvar']}", "python", "job.py",
        "--token", s["token"], f"--url=https://u:{s['url']}@h.example/x",
        f"--db=postgresql://u:{s['db']}@db.example:5432/x",
        "--data", f"https://h.example/x?token={s['query']}&part=1",
        "--wandb-key", s["wandb"], "--key", s["key"], "--aws-access-key-id", s["aws"],
        f"--private-key={s['private']}", "--credentials", s["creds"], "--pat", s["pat"],
        f"--header=Authorization: Bearer {s['bearer']}", s["hf"], s["ghp"], s["sk"], s["xox"],
        "--host", "db.example", "-u", "root", "-p", s["mysql"],
        f"https://blob.example/c?sv=2024&sig={s['sig']}", f"logger.api_key={s['hydra']}",
        "--lr", "0.1", "--key-size", "4", "--max-tokens", "100",
    ]


JOB = '''
import hashlib, os, sys
args = sys.argv[1:]
os.makedirs("out", exist_ok=True)
with open("out/argv.txt", "w") as fh:
    fh.write(hashlib.sha256("\\0".join(args).encode()).hexdigest())
if os.environ.get("FAIL"):
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # only our own stderr is left to scan
    tok = args[args.index("--token") + 1]
    raise RuntimeError(f"GET {args[2].split('=', 1)[1]} failed, token {args[18]}; "
                       f"bad token {tok}; env {os.environ['MY_API_SECRET']}")
'''


# ----------------------------------------------------------------- unit level


@pytest.mark.parametrize(("argv", "secret"), [
    (["x", "--url=https://u:S3CRETVAL@h"], "S3CRETVAL"),
    (["x", "--db=postgresql://u:S3CRETVAL@h/db"], "S3CRETVAL"),
    (["x", "https://h/a?token=S3CRETVAL"], "S3CRETVAL"),
    (["x", "https://h/a?x=1&key=S3CRETVAL"], "S3CRETVAL"),
    (["x", "https://h/a?sig=S3CRETVAL&se=1"], "S3CRETVAL"),
    (["x", "--wandb-key", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--key", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--aws-access-key-id", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--aws-secret-access-key=S3CRETVAL"], "S3CRETVAL"),
    (["x", "--private-key=S3CRETVAL"], "S3CRETVAL"),
    (["x", "--credentials", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--pat", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--password", "S3CRETVAL"], "S3CRETVAL"),
    (["x", "--hf_token=S3CRETVAL"], "S3CRETVAL"),
    (["mysql", "-u", "root", "-p", "S3CRETVAL"], "S3CRETVAL"),
    (["mysql", "--host", "h", "-pS3CRETVAL"], "S3CRETVAL"),
    (["x", "--url", "https://h", "-p", "S3CRETVAL"], "S3CRETVAL"),
    (["HF_TOKEN=S3CRETVAL", "python", "t.py"], "S3CRETVAL"),
    (["env", "WANDB_API_KEY=S3CRETVAL", "python", "t.py"], "S3CRETVAL"),
    (["x", "hf_abcdefghijklmnopqrstuvwxyz0123"], "hf_abcdefghijklmnopqrstuvwxyz0123"),
    (["x", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"], "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    (["x", "--gh=github_pat_11ABCDEFG0123456789_abcdef"], "github_pat_11ABCDEFG0123456789"),
    (["x", "xoxb-1234567890-abcdefghij"], "xoxb-1234567890-abcdefghij"),
    (["x", "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"], "sk-proj-abcdefghijklmnopqrstuv"),
    (["x", "AKIAIOSFODNN7EXAMPLE"], "AKIAIOSFODNN7EXAMPLE"),
    (["curl", "--header=Authorization: Bearer S3CRETVAL"], "S3CRETVAL"),
    (["curl", "-H", "Authorization: Basic S3CRETVAL"], "S3CRETVAL"),
    (["curl", "-H", "X-Api-Key: S3CRETVAL"], "S3CRETVAL"),
    (["sh", "-c", "python t.py --token S3CRETVAL --lr 1"], "S3CRETVAL"),
    (["bash", "-c", "HF_TOKEN=S3CRETVAL python t.py"], "S3CRETVAL"),
    (["bash", "-lc", "python t.py --api-key='S3CRETVAL'"], "S3CRETVAL"),
    (["python", "t.py", "wandb.api_key=S3CRETVAL"], "S3CRETVAL"),
    (["git", "clone", "https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/o/r"],
     "abcdefghijklmnopqrstuvwxyz0123456789"),
])
def test_every_argv_form_is_withheld_and_restorable(argv: list[str], secret: str) -> None:
    red = redact_argv(argv)
    assert secret not in "\0".join(red), red
    assert any("<redacted:" in a for a in red)
    r = Redactor()
    r.argv(argv)
    env = {f"MANIFEST_SECRET_{n}": value for value, n in r.known.items()}
    assert restore_argv(red, env) == argv  # positive control: nothing else was changed


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--lr", "0.1", "--key-size", "4", "--max-tokens", "100"],
    ["python", "train.py", "--tokenizer", "gpt2", "--token-file", "secrets/t.txt"],
    ["ssh", "-p", "22", "host"], ["python", "t.py", "-p", "8"],
    ["python", "t.py", "data.classes=[cat,dog]", "paths=[/data/a]", "--pad-token", "0"],
    ["python", "-c", "print('hello world')"], ["torchrun", "--nproc_per_node=2", "t.py"],
    ["python", "t.py", "--out", "https://h.example/bucket/path?versionId=3"],
    ["python", "t.py", "--model", "sk-learn-classifier-v2", "--dataset", "hf_internal_testing"],
])
def test_ordinary_arguments_are_kept(argv: list[str]) -> None:
    assert redact_argv(argv) == argv


def test_same_value_gets_the_same_number_and_restore_names_missing_variables() -> None:
    red = redact_argv(["x", "--token", "AAAAAAA1", "--api-key=AAAAAAA1", "--pat", "BBBBBBB2"])
    assert red == ["x", "--token", "<redacted:1>", "--api-key=<redacted:1>", "--pat",
                   "<redacted:2>"]
    with pytest.raises(MissingSecretsError, match="MANIFEST_SECRET_2"):
        restore_argv(red, {"MANIFEST_SECRET_1": "v"})
    with pytest.raises(MissingSecretsError, match="older version"):
        restore_argv(["x", "--token", "<redacted>"], {})


def test_free_text_loses_shapes_known_values_and_environment_secrets() -> None:
    text = ("GET https://u:PW12345678@host failed, token hf_abcdefghijklmnopqrstuvwxyz0123; "
            "raw VALUE1234567 and ENVVAL98765 and password: hunter2222")
    out = redact_text(text, argv=["x", "--token", "VALUE1234567"],
                      env={"MY_SERVICE_SECRET": "ENVVAL98765", "HOME": "/home/u"})
    for planted in ("PW12345678", "hf_abcdefghij", "VALUE1234567", "ENVVAL98765", "hunter2222"):
        assert planted not in out
    assert out.startswith("GET https://u:<redacted>@host failed")


def test_remote_urls_lose_userinfo_and_query() -> None:
    assert strip_url_credentials("https://oauth2:T0K3N@gitlab.example/g/r.git?x=1") == \
        "https://gitlab.example/g/r.git"
    assert strip_url_credentials("git@github.com:o/r.git") == "git@github.com:o/r.git"


@pytest.mark.parametrize(("name", "secret"), [
    (".env", True), (".env.local", True), ("prod.env", True), (".netrc", True),
    ("server.pem", True), ("id_rsa", True), ("id_ed25519.pub", True), (".git-credentials", True),
    ("gcp-credentials.json", True), ("sub/dir/.envrc", True), ("service-account-x.json", True),
    ("train.py", False), ("environment.yml", False), ("README.md", False), ("keys.py", False),
])
def test_secret_file_names(name: str, secret: bool) -> None:
    assert is_secret_file(name.encode()) is secret


# ----------------------------------------------------------------- end to end


def _written_bytes(repo: Path) -> bytes:
    """Everything under the store (blobs, caches) in one buffer."""
    store = repo / ".manifest"
    return b"".join(p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file())


@pytest.mark.slow
def test_no_planted_secret_reaches_any_written_byte(tmp_path: Path) -> None:
    s = _planted()
    repo = make_repo(tmp_path / "repo", {"job.py": JOB}, example=False)
    (repo / ".gitignore").write_text("out/\n*.json\n")  # .env & co. stay untracked, not ignored
    files = {".env": f"HF_TOKEN={s['hf']}\n", ".netrc": f"machine h login u password {s['url']}\n",
             "id_rsa": f"-----BEGIN KEY-----\n{s['key']}\n", "cfg/gcp-credentials.yaml":
             json.dumps({"private_key": s["private"]}), "notes.txt": "an ordinary new file\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    argv = _argv(s)
    env = {"MY_API_SECRET": "X" + _alnum(14)}
    planted = [*s.values(), env["MY_API_SECRET"]]

    ok = manifest_cli("capture", "--artifact", "out/*.txt", "--", *argv, cwd=repo, env=env)
    assert ok.returncode == 0, ok.stderr.decode()
    (repo / "ok.json").write_bytes(ok.stdout)
    # Positive control: the child saw every real value.
    assert (repo / "out" / "argv.txt").read_text() == \
        hashlib.sha256("\0".join(argv[4:]).encode()).hexdigest()
    failed = manifest_cli("capture", "--artifact", "out/*.txt", "--", *argv, cwd=repo,
                          env={**env, "FAIL": "1"})
    assert failed.returncode == 3, failed.stderr.decode()
    (repo / "failed.json").write_bytes(failed.stdout)
    doc = json.loads(failed.stdout)
    assert doc["outputs"]["error"].startswith("RuntimeError: GET https://u:<redacted>@h.example")
    assert "untracked_secrets" in doc["code"]["unavailable"]
    assert ".env, .netrc, cfg/gcp-credentials.yaml, id_rsa" in \
        doc["code"]["unavailable"]["untracked_secrets"]

    written = [ok.stdout, ok.stderr, failed.stdout, failed.stderr, _written_bytes(repo)]
    assert b"an ordinary new file" in written[-1]  # positive control: the patch was stored
    for verb in (["show", "ok.json"], ["show", "failed.json"], ["diff", "ok.json", "failed.json"],
                 ["diff", "--json", "ok.json", "failed.json"], ["verify", "--no-rerun", "ok.json"]):
        proc = manifest_cli(*verb, cwd=repo)
        assert proc.returncode in (0, 1), proc.stderr.decode()
        written += [proc.stdout, proc.stderr]

    missing = manifest_cli("verify", "--trust", "ok.json", cwd=repo)
    assert missing.returncode == 2
    assert b"MANIFEST_SECRET_1" in missing.stderr and b"re-running" not in missing.stderr
    r = Redactor()
    r.argv(argv)
    fill = {f"MANIFEST_SECRET_{n}": value for value, n in r.known.items()}
    rerun = manifest_cli("verify", "--trust", "--json", "ok.json", cwd=repo, env=fill)
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert json.loads(rerun.stdout)["verdict"] == "identical"
    written += [missing.stderr, rerun.stdout, rerun.stderr, _written_bytes(repo)]

    blob = b"\0".join(written)
    leaked = [v for v in planted if v.encode() in blob]
    assert len(planted) == 20 and leaked == []
    assert os.fsencode(s["hf"]) not in blob
