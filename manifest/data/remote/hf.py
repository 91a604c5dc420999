"""Hugging Face Hub datasets: pins from the repository tree at one commit.

What the Hub offers without downloading (huggingface_hub ``list_repo_tree``,
the ``/api/datasets/{id}/tree/{revision}`` endpoint, checked): per file its
path, size, git blob id (the SHA-1 of ``"blob <size>\\0" + bytes``) and, for
a file stored in LFS, the SHA-256 of its bytes. Both are content digests. The
revision (branch, tag or commit) is resolved once to its commit, and the files
are listed at that commit, so every pin is also a version pin: the commit is
gone only if history is rewritten (a force-push, a squash, a deleted repo).

The tree is sorted here (the Hub does not promise an order), one ~100-byte
entry per file in memory. Credentials: huggingface_hub's own chain (HF_TOKEN,
the cached login); never recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from manifest.data.remote.pins import ObjectPin, make_pin
from manifest.data.remote.source import CHUNK
from manifest.data.remote.url import RemoteURL, scrub
from manifest.errors import DataError


class HubSource:
    def __init__(self, url: RemoteURL, endpoint: str | None, revision: str | None) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.endpoint = endpoint
        self.commit = revision
        self.api: Any = HfApi(endpoint=endpoint)

    def _fail(self, exc: BaseException, what: str) -> DataError:
        return hub_error(exc, self.url, what)

    def list_pins(self, add: Callable[[ObjectPin], None], *, checksums: bool) -> str | None:
        from huggingface_hub.hf_api import RepoFile

        repo = self.url.bucket
        prefix = self.url.prefix
        try:
            if self.commit is None:
                self.commit = self.api.dataset_info(repo, revision=self.url.revision).sha
            entries = [e for e in self.api.list_repo_tree(
                repo, path_in_repo=prefix.rstrip("/") or None, recursive=True,
                revision=self.commit, repo_type="dataset") if isinstance(e, RepoFile)]
        except Exception as exc:
            raise self._fail(exc, "list") from None
        rows = sorted((e.path.encode("utf-8")[len(prefix.encode()):], e) for e in entries
                      if e.path.startswith(prefix))
        for rel, entry in rows:
            if entry.lfs is not None:
                add(make_pin(rel, int(entry.size), self.commit, "sha256", entry.lfs.sha256,
                             None))
            else:
                add(make_pin(rel, int(entry.size), self.commit, "git-sha1", entry.blob_id, None))
        return self.commit

    def read(self, pin: ObjectPin) -> Iterator[bytes]:
        from huggingface_hub import HfFileSystem

        from manifest.data.listing import path_bytes

        path = (self.url.prefix.encode() + path_bytes(pin.key)).decode()
        fs = HfFileSystem(endpoint=self.endpoint)
        try:
            with fs.open(f"datasets/{self.url.bucket}/{path}", "rb",
                         revision=pin.version) as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
        except Exception as exc:
            raise self._fail(exc, f"read {path} of") from None

    def drift(self) -> list[str]:
        """Whether the revision the URL names (a branch or tag) still points at the commit
        the run used: the pins hold the commit, but a script that loads ``main`` reads
        whatever ``main`` is today."""
        from huggingface_hub.errors import RevisionNotFoundError

        named = self.url.revision
        if named is None or self.commit is None or named == self.commit:
            return []
        try:
            today = self.api.dataset_info(self.url.bucket, revision=named).sha
        except RevisionNotFoundError:
            return [f"revision {named} no longer exists, the run used {self.commit}."]
        except Exception as exc:
            raise self._fail(exc, f"resolve revision {named} of") from None
        if today == self.commit:
            return []
        return [f"revision {named} now points at {today}, the run used {self.commit}."]

    def version_readable(self, pin: ObjectPin) -> bool:
        from huggingface_hub.errors import RevisionNotFoundError

        try:
            self.api.dataset_info(self.url.bucket, revision=pin.version)
        except RevisionNotFoundError:
            return False
        except Exception as exc:
            raise self._fail(exc, "look up the commit of") from None
        return True


def hub_error(exc: BaseException, url: RemoteURL, what: str) -> DataError:
    """One sentence for a failed Hub call (never the token)."""
    from huggingface_hub import errors

    where = url.text()
    if isinstance(exc, errors.RevisionNotFoundError):
        return DataError(f"cannot {what} {where}: revision {url.revision} does not exist "
                         "(or its commit is gone from the history).")
    if isinstance(exc, errors.GatedRepoError):
        return DataError(f"cannot {what} {where}: the dataset is gated.",
                         hint="Accept its terms on the Hub and log in (HF_TOKEN).")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return DataError(f"cannot {what} {where}: no such dataset, or no access to it.",
                         hint="Check the name, or log in (HF_TOKEN) for a private one.")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status == 429:
        return DataError(f"cannot {what} {where}: the Hub kept rate-limiting the listing.",
                         hint="Try again later, or log in for a higher limit.")
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DataError(f"cannot {what} {where}: {scrub(message).rstrip('.')}.")
