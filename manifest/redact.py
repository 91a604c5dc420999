"""The one redactor: every string a manifest stores that could carry a secret passes here.

A manifest is shared (PRs, papers, audits), so a credential that reaches it
is published. Three things go through this module, and nothing else redacts:

* ``command.argv`` (:func:`redact_argv`): values are withheld by the flag that
  carries them (a flag whose name has a component ``token``, ``key``,
  ``secret``, ``password``, ``credential(s)``, ``auth``, ``pat`` …, unless it
  ends in a component that names a file, size or kind: ``--key-size 4``,
  ``--token-file path`` stay), by the shape of the value (URL userinfo,
  secret-named query parameters such as ``?token=``/``?sig=``,
  ``Bearer …``/``Basic …``, token prefixes ``hf_``, ``ghp_``, ``github_pat_``,
  ``xox?-``, ``sk-``, ``AKIA``/``ASIA`` …), through ``NAME=value``
  assignments (``env HF_TOKEN=S python …``, ``wandb.api_key=S``), through a
  ``-p`` password after a user/host/URL flag, and inside shell strings
  (``sh -c '… --token S'``).
* free text stored from a failed child (``outputs.error``) and anything else
  a child prints that the manifest keeps (:func:`redact_text`): the same
  shapes, plus the literal values withheld from the argv and the values of
  secret-named variables in the environment, wherever they appear, plus
  secrets written as prose (``… failed with password hunter2``, ``the api key
  is S``, ``token: S``; :data:`_PROSE_VALUE`). A value after ``is``, ``:`` or
  ``=`` goes unless it is a word about the secret (``password is required``);
  a value right after the word only if it has a secret's shape (a digit or
  symbol mixed in, mixed case, 20+ characters): ``secret santa``, ``token
  limit``, ``tokenizer: gpt2``, ``max tokens: 100`` and ``pad token: 0`` stay.
* remote URLs (:func:`strip_url_credentials`): userinfo, query and fragment
  dropped entirely, as the URL is only an observed fact.

A redacted argv stays re-runnable: each withheld value becomes the
placeholder ``<redacted:N>`` (the same value always gets the same N), and
``manifest verify`` fills it from the variable ``MANIFEST_SECRET_N`` of its
own environment (:func:`restore_argv`); the value is never read from the
manifest. Untracked files that hold secrets by name (``.env*``, ``.netrc``,
``*.pem``, ``id_rsa*``, ``*credentials*.json`` … :func:`is_secret_file`) are
left out of the stored patch.

Over-redaction is the safe failure: a withheld non-secret costs the user one
environment variable at verify time; a missed secret is published.

Longer than 500 lines because it is the one redactor (a security decision lives
in one place): argv, free text, file names and URLs share the secret-name and
secret-shape rules, and a second module would be a second place to check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from manifest.errors import MissingSecretsError as MissingSecretsError

REDACTED = "<redacted>"
"""What free text shows in place of a secret."""

SECRET_ENV_PREFIX = "MANIFEST_SECRET_"  # noqa: S105 (a variable name, not a secret)
"""verify fills ``<redacted:N>`` from ``MANIFEST_SECRET_N``."""

_PLACEHOLDER = re.compile(r"<redacted(?::(\d+))?>")

# ------------------------------------------------------------------ names

_SECRET_WORDS = frozenset({
    "token", "tokens", "secret", "secrets", "password", "passwd", "passphrase", "pwd", "pass",
    "credential", "credentials", "cred", "creds", "key", "apikey", "auth", "authorization",
    "pat", "sig", "signature", "private", "cookie", "session", "bearer",
})
"""A name with one of these components (split on ``-``, ``_``, ``.``) carries a secret."""
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential",
                    "credentials")
"""...or a component ending in one (``hftoken``, ``dbpassword``; not ``tokenizer``)."""
_HARMLESS_LAST = frozenset({
    "size", "len", "length", "bits", "type", "kind", "file", "files", "path", "paths", "dir",
    "name", "names", "field", "col", "column", "count", "num", "limit", "max", "min", "env",
    "var", "variable", "format", "algorithm", "algo", "mode", "prefix", "suffix", "dim", "dims",
    "index", "idx", "location", "store", "storage",
})
"""A last component that says the value is not the secret itself (``--token-file``,
``--key-size``, ``--max-tokens``)."""
_HARMLESS_FIRST = frozenset({"max", "min", "num", "n", "no", "use", "total", "pad", "eos",
                             "bos", "sep", "unk", "mask", "cls", "private"})
"""A first component that makes ``tokens``/``key`` a count or vocabulary term
(``--max-tokens``, ``--pad-token``, ``--no-auth``); ``private`` alone is not secret."""


_SHELL_DIRECTORIES = frozenset({"PWD", "OLDPWD"})
"""The shell's working-directory variables (POSIX): ``pwd`` is a password only in other
names (``DB_PWD``, ``--pwd``)."""


def _components(name: str) -> list[str]:
    return [c for c in re.split(r"[-_.\s]+", name.lower().lstrip("-")) if c]


def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or parameter name says its value is a secret."""
    if name in _SHELL_DIRECTORIES:
        return False
    parts = _components(name)
    if not parts:
        return False
    if len(parts) > 1 and parts[-1] in _HARMLESS_LAST:
        return False
    if parts[0] in _HARMLESS_FIRST and len(parts) > 1 and not any(
            p in ("key", "password", "secret", "passwd") for p in parts[1:]):
        return False
    if parts == ["private"]:
        return False
    return any(p in _SECRET_WORDS or p.endswith(_SECRET_SUFFIXES) for p in parts)


# ------------------------------------------------------------------ shapes

_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])("
    r"hf_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|sk-[A-Za-z0-9_-]{32,}"  # OpenAI-style keys are 48+; not sk-learn-model-v2
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{30,}"
    r"|npm_[A-Za-z0-9]{30,}"
    r"|pypi-[A-Za-z0-9_-]{30,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r")"
)
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/\s@?#'\"]+)@")
_QUERY_PARAM = re.compile(r"([?&;])([^=&#\s'\"]+)=([^&#\s'\"]*)")
_AUTH_SCHEME = re.compile(
    r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=:-]{6,})|\b(token)(\s+)([A-Za-z0-9._~+/=:-]{20,})")
_ASSIGNMENT = re.compile(r"(?<![\w.?&;-])([A-Za-z_][\w.-]*)(=)(\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
_FLAG_VALUE = re.compile(
    r"(?<![\w-])(--?[A-Za-z][\w.-]*)(\s+|=)(\"[^\"]*\"|'[^']*'|[^\s'\"-][^\s'\"]*)")
_COLON_VALUE = re.compile(
    r"(?i)(?<![\w-])([\w.-]*(?:token|secret|password|passwd|api[-_]?key|credentials?))"
    r"(\"?\s*[:=]\s*\"?)([^\s\"',;]+)")
_PROSE_VALUE = re.compile(
    r"(?i)(?<![\w.-])("
    r"(?:aws[\s_-]+)?secret[\s_-]+access[\s_-]+key|access[\s_-]+key(?:[\s_-]+id)?"
    r"|(?:secret|private|api|signing|encryption)[\s_-]*key|apikey"
    r"|(?:access|auth|api|bearer|refresh|session|id)[\s_-]+token"
    r"|password|passwd|passphrase|secret|token|credentials?"
    r")(?![\w-])"
    r"(\s*[:=]\s*|\s+(?:is|was|are|were|set\s+to)\s*[:=]?\s+|\s+)"
    r"(\"[^\"\s]{1,200}\"|'[^'\s]{1,200}'|`[^`\s]{1,200}`|[^\s\"'`,;()\[\]{}<>]+)")
"""A secret written as prose: ``… failed with password hunter2``, ``the api key is S``,
``token: S``. With ``:``/``=``/``is`` between, the value goes unless it is a word that
says something about the secret (:data:`_PROSE_WORDS`); right after the word, only a
value that looks like one (:func:`_looks_secret`): ``secret santa``, ``token limit``
stay."""
_PROSE_WORDS = frozenset({
    "a", "an", "the", "is", "was", "are", "not", "no", "none", "null", "nil", "true",
    "false", "yes", "empty", "blank", "unset", "set", "missing", "required", "needed",
    "invalid", "incorrect", "wrong", "bad", "expired", "revoked", "rejected", "denied",
    "accepted", "valid", "correct", "ok", "too", "must", "should", "may", "can", "cannot",
    "will", "for", "from", "to", "of", "in", "on", "at", "by", "with", "and", "or", "but",
    "if", "then", "has", "have", "had", "been", "being", "be", "provided", "given", "found",
    "supplied", "specified", "configured", "length", "mismatch", "error", "failed",
    "failure", "file", "path", "env", "variable", "limit", "count", "id", "type", "format",
    "field", "value", "here", "there", "this", "that", "it", "its", "your", "my", "our",
    "their", "his", "her", "auth", "authentication", "check", "verification", "hidden",
    "redacted", "unknown", "changed", "updated", "reset", "stored", "saved", "used", "see",
    "please", "via", "using", "when", "while", "after", "before", "as", "also", "only",
})
_PROSE_HARMLESS_BEFORE = frozenset({
    "max", "min", "num", "n", "total", "pad", "eos", "bos", "sep", "unk", "mask", "cls",
    "special", "start", "end", "first", "last", "next", "per", "each", "every", "new",
    "santa", "top", "public", "no",
})
"""A word before the keyword that makes it a count or vocabulary term (``max token 42``,
``pad token: 0``, ``public key: …``)."""


def _looks_secret(value: str) -> bool:
    """Whether a bare value right after a secret word has a secret's shape: a digit or a
    symbol mixed in, mixed case at 8+, or 20+ characters; not a word, path or number."""
    if len(value) < 4 or value.lower() in _PROSE_WORDS or "/" in value:
        return False
    if value.isdigit():
        return len(value) >= 6
    has_digit = any(c.isdigit() for c in value)
    has_symbol = any(c in "!@#$%^&*+=~?|" for c in value)
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value)
    return has_digit or has_symbol or (mixed and len(value) >= 8) or len(value) >= 20


def _word_before(text: str, start: int) -> str:
    m = re.search(r"([A-Za-z]+)[\s_-]*$", text[max(0, start - 40):start])
    return m.group(1).lower() if m else ""


_USER_FLAGS = frozenset({"-u", "--user", "--username", "-h", "--host", "-U", "--url", "--uri",
                         "--endpoint", "--server", "--db", "--database", "--dsn", "--registry",
                         "--remote", "--login"})


@dataclass
class Redactor:
    """Redacts argv and text; remembers withheld values so they are never stored elsewhere.

    ``numbered`` placeholders (``<redacted:N>``) are used for argv, plain
    ``<redacted>`` for free text.
    """

    known: dict[str, int] = field(default_factory=dict)
    """Withheld value -> placeholder number."""
    where: dict[int, str] = field(default_factory=dict)
    """Placeholder number -> what it stood for (a flag or variable name; never the value)."""
    extra_values: set[str] = field(default_factory=set)
    """Secret values known from elsewhere (the environment), redacted in text."""

    def _withhold(self, value: str, label: str, numbered: bool) -> str:
        if not value or _PLACEHOLDER.search(value):  # already withheld
            return value
        if not numbered:
            return REDACTED
        n = self.known.get(value)
        if n is None:
            n = len(self.known) + 1
            self.known[value] = n
            self.where[n] = label
        return f"<redacted:{n}>"

    # ------------------------------------------------------------- text

    def text(self, text: str, *, numbered: bool = False) -> str:
        """``text`` with every secret shape, secret-named value and known value withheld."""
        if not text:
            return text

        def quoted(value: str, label: str) -> str:
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                return value[0] + self._withhold(value[1:-1], label, numbered) + value[0]
            return self._withhold(value, label, numbered)

        def userinfo(m: re.Match[str]) -> str:
            info = m.group(2)
            user, colon, password = info.partition(":")
            if colon:
                return f"{m.group(1)}{user}:{self._withhold(password, 'URL password', numbered)}@"
            if len(info) >= 20 or _TOKEN_SHAPES.fullmatch(info):
                return f"{m.group(1)}{self._withhold(info, 'URL user token', numbered)}@"
            return m.group(0)

        def query(m: re.Match[str]) -> str:
            if is_secret_param(m.group(2)):
                hidden = self._withhold(m.group(3), m.group(2), numbered)
                return f"{m.group(1)}{m.group(2)}={hidden}"
            return m.group(0)

        def named(m: re.Match[str]) -> str:
            if not is_secret_name(m.group(1)):
                return m.group(0)
            return m.group(1) + m.group(2) + quoted(m.group(3), m.group(1))

        def scheme(m: re.Match[str]) -> str:
            word, space, value = (m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6))
            return word + space + self._withhold(value, word, numbered)

        # Known values first (longest first), so a later pattern cannot split one.
        for value in sorted({*self.known, *self.extra_values}, key=len, reverse=True):
            if len(value) >= 4 and value in text:
                text = text.replace(value, self._withhold(value, "value", numbered))
        text = _URL_USERINFO.sub(userinfo, text)
        text = _QUERY_PARAM.sub(query, text)
        text = _AUTH_SCHEME.sub(scheme, text)
        text = _FLAG_VALUE.sub(named, text)
        text = _ASSIGNMENT.sub(named, text)
        def colon(m: re.Match[str]) -> str:
            # ``eos_token: </s>``, ``pad token: 0``, ``secret: true`` name no secret value.
            if (not is_secret_name(m.group(1))
                    or _word_before(m.string, m.start()) in _PROSE_HARMLESS_BEFORE
                    or m.group(3).lower() in ("true", "false", "none", "null")):
                return m.group(0)
            return m.group(1) + m.group(2) + self._withhold(m.group(3), m.group(1), numbered)

        text = _COLON_VALUE.sub(colon, text)

        def prose(m: re.Match[str]) -> str:
            word, between, value = m.group(1, 2, 3)
            bare = value.strip("\"'`")
            if _PLACEHOLDER.search(value) or _word_before(m.string, m.start()) in (
                    _PROSE_HARMLESS_BEFORE):
                return m.group(0)
            if between.strip() or value[0] in "\"'`":
                keep = bare.lower().rstrip(".:!?") in _PROSE_WORDS or not bare.strip(".:!?")
            else:
                keep = not _looks_secret(bare.rstrip(".:!?"))
            if keep:
                return m.group(0)
            # A sentence's full stop is not part of the secret.
            tail = value[len(value.rstrip(".")):] if value[0] not in "\"'`" else ""
            core = value[:len(value) - len(tail)] if tail else value
            return word + between + quoted(core, word.lower()) + tail

        if not numbered:
            # Free text only: in an argv, each word is its own argument, and a false
            # positive there would cost a MANIFEST_SECRET_N at every re-run.
            text = _PROSE_VALUE.sub(prose, text)
        return _TOKEN_SHAPES.sub(lambda m: self._withhold(m.group(1), "token", numbered), text)

    # ------------------------------------------------------------- argv

    def argv(self, argv: Sequence[str]) -> list[str]:
        """argv with every secret value replaced by ``<redacted:N>``."""
        out: list[str] = []
        pending: str | None = None  # the secret flag whose value is the next argument
        seen_user = False  # a user, host or URL came first: ``-p`` is then a password
        for arg in argv:
            if pending is not None:
                label, pending = pending, None
                if not (arg.startswith("--") or (len(arg) == 2 and arg[0] == "-")):
                    out.append(self._whole(arg, label))
                    continue
                # a secret-named switch without a value (``--auth --lr 1``)
            flag, eq, value = arg.partition("=")
            if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
                if flag in _USER_FLAGS:
                    seen_user = True
                if is_secret_name(flag) or (flag == "-p" and seen_user):
                    if eq:
                        out.append(f"{flag}={self._whole(value, flag)}")
                    else:
                        out.append(arg)
                        pending = flag
                    continue
                if seen_user and arg.startswith("-p") and len(arg) > 2 and not eq \
                        and not arg[2:].isdigit():
                    out.append("-p" + self._whole(arg[2:], "-p"))  # mysql's -pPASSWORD
                    continue
            if "://" in arg:
                seen_user = True
            # Shell strings (``sh -c '… --token S'``) and every other argument:
            # the text rules find flags, assignments and shapes inside.
            out.append(self.text(arg, numbered=True))
        return out

    def _whole(self, value: str, label: str) -> str:
        """A value that is a secret as a whole (``-p`` is a port when it is a number)."""
        if label == "-p" and value.isdigit():
            return value
        return self._withhold(value, label, True)


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def secret_values_from_env(env: Mapping[str, str]) -> set[str]:
    """Values of secret-named variables (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY`` …)."""
    return {v for k, v in env.items()
            if len(v) >= 6 and is_secret_name(k) and not k.startswith(SECRET_ENV_PREFIX)
            and v.lower() not in ("true", "false", "none", "null")}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with credentials withheld as ``<redacted:N>`` (see the module docstring)."""
    return Redactor().argv(argv)


def redact_text(text: str, *, argv: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> str:
    """Free text (a child's exception, its output) with secrets replaced by ``<redacted>``.

    Values withheld from ``argv`` and the values of secret-named variables of
    ``env`` (default: this process's environment) are removed wherever they
    occur, whatever their shape.
    """
    r = Redactor()
    r.argv(argv)
    r.extra_values = secret_values_from_env(os.environ if env is None else env)
    return r.text(text)


# -------------------------------------------------------------- re-running


def withheld(argv: Sequence[str]) -> list[int]:
    """The placeholder numbers in a recorded argv; 0 stands for an unnumbered ``<redacted>``."""
    found: set[int] = set()
    for arg in argv:
        for m in _PLACEHOLDER.finditer(arg):
            found.add(int(m.group(1)) if m.group(1) else 0)
    return sorted(found)


def restore_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The argv to run: each ``<redacted:N>`` filled from ``MANIFEST_SECRET_N`` in ``env``.

    Raises :class:`MissingSecretsError` naming every variable that is not set
    (and for an unnumbered ``<redacted>``, which older versions wrote).
    """
    numbers = withheld(argv)
    if 0 in numbers:
        raise MissingSecretsError(
            "the recorded command has a value withheld by an older version of manifest "
            "(<redacted> without a number), which cannot be filled in")
    missing = [f"{SECRET_ENV_PREFIX}{n}" for n in numbers if f"{SECRET_ENV_PREFIX}{n}" not in env]
    if missing:
        raise MissingSecretsError(
            f"the recorded command has {len(numbers)} value(s) withheld at capture; "
            f"set {', '.join(missing)} in the environment to the original value(s)")
    return [_PLACEHOLDER.sub(lambda m: env[f"{SECRET_ENV_PREFIX}{m.group(1)}"], a) for a in argv]


# ------------------------------------------------------------------- URLs

_URL_SECRET_PARAMS = frozenset({
    "sig", "signature", "token", "key", "code", "auth", "access_token", "id_token",
    "refresh_token", "private_token", "client_secret", "apikey", "api_key", "password",
    "passwd", "pwd", "secret", "jwt", "session", "sessiontoken", "security-token",
    "awsaccesskeyid", "googleaccessid", "credential", "x-amz-signature",
    "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
})
_URL_SECRET_PREFIXES = ("x-amz-", "x-goog-", "x-ms-", "x-oss-", "x-cos-")
"""Presigned URLs (S3, GCS, Azure, Alibaba, Tencent): every such parameter is withheld; a
signature cannot be told from its date and algorithm by name alone, and over-redaction
is the safe failure."""


def is_secret_param(name: str) -> bool:
    """Whether a URL query (or fragment) parameter carries a credential or a signature:
    ``X-Amz-*``, ``X-Goog-*``, ``sig``, ``signature``, ``token``, ``key``,
    ``access_token`` … or any secret-named parameter (:func:`is_secret_name`);
    percent-encoded names are decoded first (``X%2DAmz%2DSignature``)."""
    from urllib.parse import unquote

    plain = unquote(name).strip().lower()
    return (plain in _URL_SECRET_PARAMS or plain.startswith(_URL_SECRET_PREFIXES)
            or is_secret_name(plain))


_URL_START = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)")
_URL_PORT = re.compile(r"[0-9]*(?:[/?#]|$)")


def redact_url(url: str) -> str:
    """A URL as it was typed, with its userinfo and every credential-carrying query or
    fragment parameter withheld (``<redacted>``): for sentences and reports, where the
    user must recognise what they wrote (no normalisation: ``file:///etc/passwd`` stays
    ``file:///etc/passwd``). Text without ``scheme://`` is returned as it is."""
    match = _URL_START.match(url)
    if match is None:
        return url
    head, rest = match.group(1), url[match.end():]
    # Userinfo: ``user:password@`` (a password may hold ``/`` or ``?`` unencoded, as AWS
    # secret keys do) or ``token@`` before the host.
    cut = -1
    colon = rest.find(":")
    first_stop = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#"))
                      if i >= 0), default=len(rest))
    if 0 <= colon < first_stop and "@" in rest[colon:] and not _URL_PORT.match(
            rest, colon + 1):
        cut = rest.find("@", colon)
    elif "@" in rest[:first_stop]:
        cut = rest.rfind("@", 0, first_stop)
    if cut >= 0:
        rest = REDACTED + rest[cut:]
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if query_at < 0:
        return head + rest

    def param(m: re.Match[str]) -> str:
        name, eq, value = m.group(2), m.group(3), m.group(4)
        if eq and value and is_secret_param(name):
            return f"{m.group(1)}{name}={REDACTED}"
        return m.group(0)

    tail = re.sub(r"([?#&;]|^)([^=&;#]*)(=?)([^&;#]*)", param, rest[query_at:])
    return head + rest[:query_at] + tail


def redact_urls(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url` (error sentences,
    notes, job logs): a URL runs to the next whitespace or quote."""
    if "://" not in text:
        return text
    def one(m: re.Match[str]) -> str:
        url = m.group(0)
        core = url.rstrip(".,:;)]")  # a sentence's punctuation is not part of the URL
        return redact_url(core) + url[len(core):]

    return re.sub(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*", one, text)



def strip_url_credentials(url: str) -> str:
    """A remote URL without credentials: userinfo, query and fragment dropped.

    scp-style ``user@host:path`` keeps a plain user name
    (``git@github.com:org/x.git``) but loses a userinfo that carries a
    password (``oauth2:TOKEN@host:path``).
    """
    from urllib.parse import urlsplit, urlunsplit

    if "://" not in url:
        userinfo, at, rest = url.partition("@")
        if at and ":" in userinfo and "/" not in userinfo:
            return rest
        return Redactor().text(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port:
        host = f"{host}:{port}"
    return Redactor().text(urlunsplit((parts.scheme, host, parts.path, "", "")))


# ------------------------------------------------------------------ files

SECRET_FILE_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pgpass",
    ".npmrc", ".pypirc", ".htpasswd", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*credentials*.json",
    "credentials", "*credentials*.toml", "*credentials*.yaml", "*credentials*.yml",
    "*secret*.json", "*secrets*.toml", "*secrets*.yaml", "*secrets*.yml", "*.kdbx",
    "service-account*.json", "*service_account*.json", "token.json", "*.token",
)
"""Untracked files never copied into a patch blob (matched on the file name)."""


def is_secret_file(path: str | bytes) -> bool:
    """Whether an untracked file's name says it holds credentials."""
    name = os.path.basename(os.fsdecode(path)).lower()
    return any(fnmatchcase(name, pattern) for pattern in SECRET_FILE_PATTERNS)


def secret_files(paths: Iterable[bytes]) -> list[bytes]:
    """The secret-bearing names among ``paths``."""
    return [p for p in paths if is_secret_file(p)]
