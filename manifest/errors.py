"""The project's errors.

Every failure that reaches a user is one of these, carrying one sentence that
says what went wrong and what to do next. The CLI prints ``diagnostics()`` to
stderr and exits with ``exit_code``; nothing else is ever shown.

    ManifestError                 base, exit 2 unless a subclass says otherwise
    ├── UsageError                bad option or argument (exit 2)
    │   └── MissingSecretsError       a redacted argv whose MANIFEST_SECRET_N are not set
    ├── InvalidManifestError      not JSON, NaN, duplicate keys, wrong types (exit 2)
    │   ├── UnsupportedSchemaError    unknown schema version (exit 2)
    │   ├── TamperedManifestError     run_id or digest does not match (exit 2)
    │   └── SignatureError            a signature or pack that does not check out (exit 2)
    ├── OutputError               cannot write where asked (exit 2)
    ├── MalformedArtifactError    an output claims a weight format but is malformed (exit 2)
    ├── WeightFileError           a weight file that cannot be parsed: recorded as a plain file
    │   └── MalformedWeightsError     impossible or hostile offsets, sizes or structure
    ├── DataError                 dataset path missing/unreadable (exit 2)
    ├── ConfigError               bad [tool.manifest] in pyproject.toml (exit 2)
    ├── MissingExtraError         an optional library is not installed: the install line (exit 2)
    ├── UntrustedManifestError    verify refuses to run code without --trust (exit 2)
    │   └── UntrustedSignerError      a valid signature by a signer the policy does not list
    └── NoVerdictError            a verdict could not be reached (exit 3)

    Terminated (a BaseException)  SIGTERM/SIGHUP while a verb holds something to put back;
                                  the CLI exits as the signal would
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_VERDICT = 3
EXIT_EQUIVALENT = 4
"""verify: not the same bits, the same run up to rounding (``manifest.numeric.envelope``).
Its own status, not 0: a script that reads 0 as "bit-identical" keeps that meaning."""


class ManifestError(Exception):
    """Base error: ``str(err)`` is the one sentence shown to the user."""

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def diagnostics(self) -> str:
        """The text for stderr: the sentence, and what to do about it if known."""
        if self.hint:
            return f"{self.message} {self.hint}"
        return self.message


class UsageError(ManifestError):
    pass


class InvalidManifestError(ManifestError):
    pass


class UnsupportedSchemaError(InvalidManifestError):
    pass


class TamperedManifestError(InvalidManifestError):
    pass


class SignatureError(InvalidManifestError):
    pass


class OutputError(ManifestError):
    pass


class MalformedArtifactError(ManifestError):
    pass


class WeightFileError(ManifestError):
    """A weight file that cannot be parsed (``manifest.weights``): recorded as a plain file."""


class MalformedWeightsError(WeightFileError):
    """A file that claims a weight format but whose offsets, sizes or structure are
    impossible or hostile: refused at capture (as a ``MalformedArtifactError``), a
    difference at verify."""


class MissingSecretsError(UsageError):
    """A redacted argv cannot be restored (``manifest.redact.restore_argv``): the message
    names the variables to set."""


class DataError(ManifestError):
    pass


class ConfigError(ManifestError):
    pass


class UntrustedManifestError(ManifestError):
    pass


class UntrustedSignerError(UntrustedManifestError):
    pass


class NoVerdictError(ManifestError):
    exit_code = EXIT_NO_VERDICT


EXTRA_OF_MODULE: dict[str, str] = {
    "cryptography": "sign", "sigstore": "sign", "in_toto_attestation": "sign",
    "model_signing": "sign", "OpenSSL": "sign",
    "matplotlib": "plot",
    "mlflow": "mlflow", "wandb": "wandb", "lightning": "lightning",
    "pytorch_lightning": "lightning", "transformers": "transformers", "accelerate": "transformers",
    "cyclonedx": "sbom", "spdx_python_model": "sbom",
    "boto3": "s3", "botocore": "s3", "google": "gcs", "huggingface_hub": "hf",
    "deltalake": "delta",
    "ray": "ray", "submitit": "slurm", "kubernetes": "k8s",
    "torch": "torch", "safetensors": "torch", "numpy": "numpy",
}
"""Each optional library's top-level import name → the extra of pyproject.toml that installs it:
any verb whose import of one fails says the extra's install line (``cli.app``), as ``--on``
(``rerun.cluster.options``) and a ``--data`` URL (``data.remote.registry``) say theirs
before importing anything. ``tests/test_cli_hints.py`` checks every extra named exists."""


def install_line(extra: str) -> str:
    """The command that installs an extra, as every sentence spells it."""
    return f"pip install 'torch-manifest[{extra}]'"


class MissingExtraError(UsageError):
    """An optional library is not installed: what needs it, and the line that installs it.
    Exit 2 (the user's setup, not a fault of the tool, nor a verdict withheld)."""

    def __init__(self, module: str, extra: str, *, what: str | None = None) -> None:
        needs = f"{what} needs" if what else "this needs"
        super().__init__(f"{needs} the '{extra}' extra ({module} is not installed): "
                         f"{install_line(extra)}.")
        self.module = module
        self.extra = extra


def missing_extra(exc: ImportError, *, what: str | None = None) -> MissingExtraError | None:
    """The error for an import that failed because an extra's library is absent, or None
    when the missing module is none of theirs (then it is a fault of the installation
    or the tool, and stays an internal error)."""
    name = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    return None if extra is None else MissingExtraError(name, extra, what=what)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM or SIGHUP while a verb holds something to put
    back (a scratch tree, an envelope run's moved outputs), so ``finally`` runs; the CLI
    then exits as the signal would. A ``BaseException``: no ``except Exception`` eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_terminated(signum: int, frame: object) -> None:
    """The signal handler that turns SIGTERM/SIGHUP into :class:`Terminated`."""
    del frame
    raise Terminated(signum)
