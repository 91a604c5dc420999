"""After ``capture`` seals a run: tag the tracker runs it logged to with the real run_id.

While a run trains, the Lightning and Hugging Face callbacks can only log the run's
*launch* id (``manifest.launch_id``, ``manifest.launch.runner.launch_identity``: code,
redacted command, seed); the run_id also covers what the run did (the inputs it read,
the environment variables it looked at, what it imported), known only at its end. So
each callback also leaves, in its process record, a *locator* for every tracker it can
name (``TRACKERS_KEY``; ``manifest.integrations._locators``), and once the manifest is
sealed :func:`tag_trackers` writes ``manifest.run_id`` and ``manifest.digest`` back:

* MLflow: ``MlflowClient(tracking_uri).set_tag`` on the logged run (MLflow params are
  immutable, so the launch id went in as a param under its own name and the run_id
  comes as a tag). HTTP retries are off unless the user set them: with MLflow's default
  (7 retries with backoff) a capture whose server refused connections waited 247 s before
  its note, without them 1.1 s (the whole capture of a small script, mlflow's import
  included; 0.3 s with no tracker); a failure is one note, never a failed capture;
* W&B: an online run through the public API (``wandb.Api``); an offline one cannot be
  reached until ``wandb sync``, so a note says what to run then;
* log directories (TensorBoard/CSV loggers' ``log_dir``, HF ``output_dir``, the tree
  itself included): ``manifest-run.json`` ``{run_id, digest, launch_id}``, only in a real
  directory inside the run's tree (not in ``.git``), reached without following a link,
  never where a declared output glob would find it (the next capture would refuse it as
  an earlier run's leftover), never inside a dataset the manifest records (its digest
  would change: ``verify`` said the data changed), never over a file git tracks (code),
  each directory once, and remembered as run-written, so the next capture's code
  snapshot leaves it out. An MLflow file store in the tree (Lightning's default
  ``file:./mlruns``) gets the same memory for the tag files ``set_tag`` adds: without it
  each capture's code, so its run_id, changed with the previous capture's tags.

**Only this capture's own tracker runs.** A locator is the run's output, so it can name
any run in any store the machine reaches, among them another project's, whose
``manifest.run_id`` tag is the link its team follows to its own manifest. An MLflow run is
tagged only when its store is in the tree or is the one the user named
(``MLFLOW_TRACKING_URI`` in capture's environment), and this capture's run created it or
logged to it: its ``start_time``, ``end_time`` or a latest metric's time stamp falls within
the capture (``observed.started_at`` to ``finished_at``, and 1 s after). A W&B run is
tagged only when it was created within the capture. Any other is one note naming the
store, and nothing is written. A run resumed from an earlier capture and only read from
this one (no metric, no end) is not tagged: the note gives the run_id to set by hand.

Only ``capture`` tags, and last: ``capture_from_cli(tagging=…)`` hands a :class:`Tagging`
back and the verb runs it once the manifest is written (a server that does not answer
costs up to 20 s, and an interrupt then must not cost the manifest). ``gate`` passes no
list: its capture is a check. ``verify``, ``explain`` and ``lab`` re-run someone else's
run, often from a manifest that came from elsewhere: a re-run must not write into the
tracking server the recorded run logged to, so they never call this.

A locator is the run's own output, so it is untrusted input: at most
``MAX_LOCATOR_BYTES`` per process (a real one is under 300 bytes) and ``MAX_LOCATORS``
entries in all (however many processes left some), schema-checked (unknown keys
refused), a tracking URI handed to mlflow's client only (never opened here), a log
directory confined to the tree, and every note URL-redacted and printable.

Longer than 500 lines because MLflow, W&B and log-directory tagging share one set of
limits (what a locator may claim) and one ownership rule (only this capture's runs);
each tracker's part is about 100 lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from manifest.capture.tracker_names import (
    MAX_LOCATOR_BYTES,
    MAX_LOCATORS,
    RUN_FILE,
    TAG_DIGEST,
    TAG_LAUNCH_ID,
    TAG_RUN_ID,
    TRACKERS_KEY,
)

__all__ = ["MAX_LOCATORS", "MAX_LOCATOR_BYTES", "RUN_FILE", "TAG_DIGEST", "TAG_LAUNCH_ID",
           "TAG_RUN_ID", "TRACKERS_KEY", "Tagging", "plan_tagging", "read_locators",
           "tag_trackers"]

_Text = Annotated[str, StringConstraints(min_length=1, max_length=4096,
                                         pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")]
_Name = Annotated[str, StringConstraints(min_length=1, max_length=128,
                                         pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class _Locator(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MlflowLocator(_Locator):
    kind: Literal["mlflow"]
    tracking_uri: _Text
    run_id: _Name


class WandbLocator(_Locator):
    kind: Literal["wandb"]
    entity: _Name | None = None
    project: _Name
    run_id: _Name
    offline: bool
    dir: _Text | None = None


class LogDirLocator(_Locator):
    kind: Literal["log_dir"]
    path: _Text


Locator = Annotated[MlflowLocator | WandbLocator | LogDirLocator, Field(discriminator="kind")]
_LOCATORS: TypeAdapter[list[Locator]] = TypeAdapter(
    Annotated[list[Locator], Field(max_length=MAX_LOCATORS)])


def read_locators(records: list[Any]) -> tuple[list[Any], list[str]]:
    """The valid locators the processes left (each once, at most ``MAX_LOCATORS`` in all,
    however many processes left some), and a note per refused record."""
    found: list[Any] = []
    notes: list[str] = []
    dropped = 0
    for record in records:
        if not isinstance(record, dict):  # a record file holding `[1]`: no process's record
            continue
        raw = record.get(TRACKERS_KEY)
        if raw is None:
            continue
        who = f"rank {record.get('rank', '?')}"
        try:
            size = len(json.dumps(raw))
        except (TypeError, ValueError, RecursionError):
            size = MAX_LOCATOR_BYTES + 1
        if size > MAX_LOCATOR_BYTES:
            notes.append(f"{who} left {size} bytes of tracker locators, over the "
                         f"{MAX_LOCATOR_BYTES // 1024} KiB a process may leave; no tracker tagged "
                         "from it.")
            continue
        try:
            locators = _LOCATORS.validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            notes.append(f"{who}'s tracker locators are malformed ({where}: {first['msg']}); "
                         "no tracker tagged from it.")
            continue
        for loc in locators:
            if loc in found:
                continue
            if len(found) < MAX_LOCATORS:
                found.append(loc)
            else:
                dropped += 1
    if dropped:
        notes.append(f"{dropped} more tracker run(s) not tagged: at most {MAX_LOCATORS} are "
                     "tagged per capture, whatever the number of processes.")
    return found, notes


@dataclass
class Tagging:
    """The tagging a sealed capture hands back (``capture_from_cli(tagging=…)``): run it
    once the manifest is written, so an interrupt or a slow tracker cannot cost the run."""

    manifest: Any
    locators: list[Any]
    notes: list[str]
    tree: Path
    store: Any = None

    def run(self, say: Callable[[str], None] | None = None) -> list[str]:
        """Tag every tracker run with the manifest's run_id and digest; returns the lines
        said. Never raises for a tracker's failure: the capture has succeeded whatever a
        tracker answers."""
        lines: list[str] = []

        def tell(line: str) -> None:
            lines.append(_printable(line))
            if say is not None:
                say(lines[-1])

        for note in self.notes:
            tell(note)
        if not self.locators:
            return lines
        manifest = self.manifest
        launch_id = None
        if manifest.command is not None:
            from manifest.launch.runner import launch_identity

            launch_id = launch_identity(manifest.code.commit, manifest.code.diff_digest,
                                        list(manifest.command.argv),
                                        manifest.randomness.seed or 0)
        values = {"run_id": manifest.run_id, "digest": manifest.digest, "launch_id": launch_id}
        cwd = self.tree / (manifest.command.cwd if manifest.command is not None else ".")
        place = _Place(self.tree, cwd,
                       list(manifest.command.outputs) if manifest.command is not None else [],
                       _dataset_paths(manifest, self.tree))
        written: list[str] = []
        seen: set[str] = set()
        window = capture_window(manifest)
        try:
            for loc in self.locators:
                line: str | None
                try:
                    if isinstance(loc, MlflowLocator):
                        line = _tag_mlflow(loc, values, self.tree, written, window)
                    elif isinstance(loc, WandbLocator):
                        line = _tag_wandb(loc, values, window)
                    else:
                        line = _write_run_file(loc, values, place, written, seen)
                except Exception as exc:  # a tracker's own failure is a note, never a failure
                    line = f"{loc.kind} tracker not tagged: {_reason(exc)}"
                if line is not None:  # None: a directory already named
                    tell(line)
        finally:  # an interrupt too: what was written is remembered
            if written and self.store is not None:
                from manifest.capture.observed import remember_written

                remember_written(self.store, written)
        return lines


def plan_tagging(manifest: Any, records: list[Any], *, tree: Path,
                 store: Any = None) -> Tagging:
    """What :meth:`Tagging.run` will tag for this sealed manifest: the records' valid
    locators (none for one node of several) and the notes on the refused ones."""
    locators, notes = read_locators(records)
    topology = manifest.command.topology if manifest.command is not None else None
    if locators and topology is not None and topology.nodes > 1:
        # This node's manifest is one part; the run's run_id is the merged one's.
        notes.append(f"{len(locators)} tracker run(s) not tagged: this is one node of a "
                     f"{topology.nodes}-node run, whose run_id is the merged manifest's.")
        locators = []
    return Tagging(manifest, locators, notes, tree, store)


def tag_trackers(manifest: Any, records: list[Any], *, tree: Path,
                 store: Any = None, say: Callable[[str], None] | None = None) -> list[str]:
    """Plan and run the tagging at once (:func:`plan_tagging`, :meth:`Tagging.run`)."""
    return plan_tagging(manifest, records, tree=tree, store=store).run(say)


def _printable(line: str, limit: int = 600) -> str:
    """A note as one printable line: a locator's text (a key name, a path, what pydantic
    quotes of it) cannot move the cursor or colour the terminal, nor run on for kilobytes,
    and a URL in it shows no userinfo or credential (``manifest.redact.redact_urls``)."""
    from manifest.redact import redact_urls

    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in redact_urls(line))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _reason(exc: BaseException) -> str:
    from manifest.redact import redact_urls

    text = redact_urls((str(exc).strip().splitlines() or [""])[0])
    if len(text) > 200:  # a client's message can quote a whole request: its head is enough
        text = text[:text.rfind(" ", 0, 200)] + " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def _quiet(defaults: dict[str, str], logger_name: str) -> Iterator[None]:
    """A tracker client with ``defaults`` in the environment where the user set none (no long
    retries, no waiting for a login prompt), and without its warnings and log lines on our
    stderr; all restored afterwards."""
    import logging
    import warnings

    added = [k for k in defaults if k not in os.environ]
    for key in added:
        os.environ[key] = defaults[key]
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        for key in added:
            os.environ.pop(key, None)


MLFLOW_QUICK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
WANDB_QUICK = {"WANDB_LOGIN_TIMEOUT": "1", "WANDB_SILENT": "true"}


def _tag_mlflow(loc: MlflowLocator, values: dict[str, str | None], tree: Path,
                written: list[str], window: tuple[float, float] | None) -> str:
    from manifest.redact import redact_url

    shown = f"MLflow run {loc.run_id} at {redact_url(loc.tracking_uri)}"
    run_dir = _file_store_run(loc, tree)
    if run_dir is None and not _named_by_user(loc.tracking_uri):
        return (f"{shown} not tagged: its store is outside the run's tree and is not the "
                f"one the user named ({MLFLOW_URI_VARIABLE}); nothing written (the run_id is "
                f"{values['run_id']}).")
    before = _listing(run_dir) if run_dir is not None else {}
    try:
        with _quiet(MLFLOW_QUICK, "mlflow"):
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=loc.tracking_uri)
            if not _ours_mlflow(client.get_run(loc.run_id), window):
                return (f"{shown} not tagged: it was neither started nor logged to during "
                        "this capture (another run's); nothing written (the run_id is "
                        f"{values['run_id']}).")
            client.set_tag(loc.run_id, TAG_RUN_ID, str(values["run_id"]))
            client.set_tag(loc.run_id, TAG_DIGEST, str(values["digest"]))
    except ImportError:
        return f"{shown} not tagged: mlflow is not importable here."
    except Exception as exc:
        return f"{shown} not tagged ({_reason(exc)}); the run_id is {values['run_id']}."
    finally:
        if run_dir is not None:  # a file store in the tree: what the tags added is no code
            after = _listing(run_dir)
            written += [os.path.relpath(path, tree) for path, seen in after.items()
                        if before.get(path) != seen]
    return f"tagged {shown} with {TAG_RUN_ID} {values['run_id']}."


MLFLOW_URI_VARIABLE = "MLFLOW_TRACKING_URI"
CLOCK_SLACK_S = 1.0
"""Seconds after the capture's end in which a tracker's time stamp still counts as this
capture's (the manifest's ``finished_at`` is taken to the microsecond, MLflow's stamps to
the millisecond). None before its start: MLflow's client stamps a run's start, end and
metrics with its own clock, this machine's, in the run's process, which starts after
``started_at``; a run stamped a second before it is another's (the hostile test makes one
in the seconds before the capture)."""


def capture_window(manifest: Any) -> tuple[float, float] | None:
    """The capture's start and end (epoch seconds, ``observed.started_at`` and
    ``finished_at``), the end widened by :data:`CLOCK_SLACK_S`; None when they cannot be read (then
    no tracker run counts as this capture's)."""
    from datetime import datetime

    observed = getattr(manifest, "observed", None)
    try:
        start = datetime.fromisoformat(observed.started_at).timestamp()  # type: ignore[union-attr]
        end = datetime.fromisoformat(observed.finished_at).timestamp()  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        return None
    return start, end + CLOCK_SLACK_S


def _within(window: tuple[float, float] | None, millis: Any) -> bool:
    return (window is not None and isinstance(millis, int) and not isinstance(millis, bool)
            and window[0] <= millis / 1000 <= window[1])


def _ours_mlflow(run: Any, window: tuple[float, float] | None) -> bool:
    """Whether this capture's run created the MLflow run (its ``start_time`` within the
    capture) or logged to it (it ended within it, or a metric's latest value was logged
    within it): any other run is another project's, whose ``manifest.run_id`` tag is the
    link its team follows to its own manifest."""
    info = getattr(run, "info", None)
    stamps = [getattr(info, "start_time", None), getattr(info, "end_time", None)]
    data = getattr(run, "data", None)
    stamps += [getattr(m, "timestamp", None) for m in getattr(data, "_metric_objs", None) or []]
    return any(_within(window, stamp) for stamp in stamps)


def _named_by_user(uri: str) -> bool:
    """Whether the tracking URI is the store the user named for this capture
    (``MLFLOW_TRACKING_URI`` in capture's own environment, which the run inherited): the
    same text, or the same local directory for two spellings of a file store."""
    named = os.environ.get(MLFLOW_URI_VARIABLE, "")
    if not named:
        return False
    if named == uri:
        return True
    mine, theirs = _local_store(named), _local_store(uri)
    return mine is not None and mine == theirs


def _local_store(uri: str) -> str | None:
    """The real path of a file store's URI (``file:…`` or a bare path), None for a server."""
    from urllib.parse import unquote, urlparse

    if uri.startswith("file:"):
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            return None
        return os.path.realpath(unquote(parsed.path))
    if "://" not in uri and ":" not in uri:
        return os.path.realpath(uri)
    return None


def _file_store_run(loc: MlflowLocator, tree: Path) -> Path | None:
    """The run's directory in an MLflow file store inside the tree (``file:./mlruns``,
    Lightning's default: ``<store>/<experiment>/<run id>/``); None for any other store."""
    from urllib.parse import unquote, urlparse

    uri = loc.tracking_uri
    if uri.startswith("file:"):
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            return None
        path = unquote(parsed.path)
    elif "://" not in uri and ":" not in uri:
        path = uri
    else:
        return None
    store = os.path.realpath(path)
    rel = os.path.relpath(store, os.path.realpath(tree))
    if rel == ".." or rel.startswith("../") or not os.path.isdir(store):
        return None
    with contextlib.suppress(OSError), os.scandir(store) as entries:
        for entry in entries:
            run = os.path.join(tree, rel, entry.name, loc.run_id)
            if entry.is_dir(follow_symlinks=False) and os.path.isdir(run) \
                    and not os.path.islink(run):
                return Path(os.path.normpath(run))
    return None


def _listing(run_dir: Path, limit: int = 4096) -> dict[str, tuple[int, int]]:
    """(mtime, size) of each file in an MLflow run's directory but its artifacts, at most
    ``limit`` (a run has a file per param, tag and metric: tens)."""
    found: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(run_dir):
        if top == str(run_dir):
            dirs[:] = [d for d in dirs if d != "artifacts"]
        for name in files:
            path = os.path.join(top, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                found[path] = (st.st_mtime_ns, st.st_size)
            if len(found) >= limit:
                return found
    return found


def _wandb_ours(run: Any, window: tuple[float, float] | None) -> bool:
    """Whether the W&B run was created within this capture (``created_at``, UTC)."""
    from datetime import UTC, datetime

    created = getattr(run, "created_at", None)
    if not isinstance(created, str):
        return False
    try:
        when = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _within(window, int(when.timestamp() * 1000))


def _tag_wandb(loc: WandbLocator, values: dict[str, str | None],
               window: tuple[float, float] | None) -> str:
    path = "/".join(p for p in (loc.entity, loc.project, loc.run_id) if p)
    tags = {TAG_RUN_ID: values["run_id"], TAG_DIGEST: values["digest"]}
    if loc.offline:
        where = f" ({loc.dir})" if loc.dir else ""
        # Names are [A-Za-z0-9_.-] (the schema) and values blake3 hex: safe in quotes.
        return (f"W&B run {path} is offline{where}, not tagged: after `wandb sync`, run "
                f"python -c \"import wandb; wandb.Api().run('{path}').summary.update("
                f"{tags!r})\".")
    try:
        with _quiet(WANDB_QUICK, "wandb"):
            import wandb

            run = wandb.Api(timeout=20).run(path)
            if not _wandb_ours(run, window):
                return (f"W&B run {path} not tagged: it was not created during this capture "
                        f"(another run's); nothing written (the run_id is {values['run_id']}).")
            run.summary.update(tags)  # type: ignore[no-untyped-call]
    except Exception as exc:
        return f"W&B run {path} not tagged ({_reason(exc)}); the run_id is {values['run_id']}."
    return f"tagged W&B run {path} with {TAG_RUN_ID} {values['run_id']}."


@dataclass(frozen=True)
class _Place:
    """Where a run file may go: the tree, the run's cwd, its declared output globs and
    the real paths of its datasets."""

    tree: Path
    cwd: Path
    outputs: list[str]
    datasets: list[tuple[str, str]]


def _dataset_paths(manifest: Any, tree: Path) -> list[tuple[str, str]]:
    """(name, real path) of each local dataset the manifest records, declared or read."""
    found = []
    for d in manifest.data:
        if d.remote is not None or "://" in d.path:
            continue
        found.append((d.name, os.path.realpath(os.path.join(tree, d.path))))
    return found


def _write_run_file(loc: LogDirLocator, values: dict[str, str | None], place: _Place,
                    written: list[str], seen: set[str]) -> str | None:
    """``manifest-run.json`` in the log directory, opened component by component from the
    tree without following any link, so a directory swapped for a link cannot lead out;
    None when an earlier locator named the same directory."""
    from manifest.redact import redact_url

    if "://" in loc.path:  # a bucket (TensorBoard writes to s3://, gs://): not ours to write
        return f"log directory {redact_url(loc.path)} is not a local directory; {RUN_FILE} " \
               "not written."
    tree, cwd = place.tree, place.cwd
    rel = os.path.relpath(os.path.normpath(os.path.join(cwd, loc.path)), tree)
    parts = Path(rel).parts
    if rel in seen:
        return None
    seen.add(rel)
    if os.path.isabs(rel) or (parts and parts[0] == ".."):
        return f"log directory {loc.path} is outside the run's tree; {RUN_FILE} not written."
    if ".git" in parts:
        return f"log directory {loc.path} is inside .git; {RUN_FILE} not written."
    target = (Path(rel) / RUN_FILE).as_posix()
    if any(_glob_names(pattern, os.path.relpath(tree / target, cwd))
           for pattern in place.outputs):
        return (f"{target} would match a declared output glob; not written (the next "
                "capture would take it for an earlier run's leftover).")
    real = os.path.join(os.path.realpath(tree), target)
    for name, path in place.datasets:
        if real == path or real.startswith(path.rstrip(os.sep) + os.sep):
            return (f"log directory {rel} is inside the dataset {name}; {RUN_FILE} not "
                    "written (the dataset's digest would change).")
    if _tracked(tree, target):
        return f"{target} is tracked by git; not overwritten (it is code, not a run's output)."
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return f"log directory {rel} does not exist; {RUN_FILE} not written."
            if not stat.S_ISDIR(st.st_mode):
                what = "a link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                return f"log directory {rel} is {what} at {part}; {RUN_FILE} not written."
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        body = {"run_id": values["run_id"], "digest": values["digest"],
                "launch_id": values["launch_id"]}
        tmp = f".{RUN_FILE}.{os.getpid()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                      dir_fd=fd)
        try:
            with os.fdopen(out, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(body, indent=2) + "\n")
            os.replace(tmp, RUN_FILE, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
        written.append(target)
    finally:
        os.close(fd)
    return f"wrote {target} (run_id {values['run_id']})."


def _tracked(tree: Path, target: str) -> bool:
    """Whether git tracks ``target`` in the tree (a committed run file is code)."""
    from manifest.gitrun import run_git

    if not (tree / ".git").exists():
        return False
    out = run_git(["ls-files", "-z", "--", target], tree, check=False)
    return out.returncode == 0 and bool(out.stdout.strip(b"\0"))


def _glob_names(pattern: str, rel: str) -> bool:
    """Whether capture's glob (``glob.glob(pattern, root_dir=cwd, recursive=True)``) would
    name the relative path ``rel`` once it exists: fnmatch per component, ``**`` any number
    of components, no hidden name matched by a wildcard (``glob.translate`` is 3.13+)."""
    import fnmatch

    def match(pats: list[str], names: list[str]) -> bool:
        if not pats:
            return not names
        if pats[0] == "**":
            return any(match(pats[1:], names[i:]) for i in range(len(names) + 1)
                       if all(not n.startswith(".") for n in names[:i]))
        if not names:
            return False
        name = names[0]
        if name.startswith(".") and not pats[0].startswith("."):
            return False
        return fnmatch.fnmatchcase(name, pats[0]) and match(pats[1:], names[1:])

    return match(list(Path(pattern).parts) if pattern else [], list(Path(rel).parts))
