"""A container image reference, checked against the OCI reference grammar before it is
rendered into a pod spec.

``--on k8s`` writes the image into the Job it renders: the user's ``--image``, or the
one a received manifest recorded (``env.container.image_digest``). A recorded string
is data from elsewhere: one with a newline, a YAML document marker or 100,000
characters was copied into the pod spec as it was. So :func:`check_reference` accepts
exactly the grammar of the distribution project's ``reference`` package (what
``docker pull``, containerd and the kubelet parse)::

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] path-component [ "/" path-component ]*
    domain     := host [ ":" port ]        (a DNS name, an IPv4 address or [IPv6])
    path-component := [a-z0-9]+ ( ( [._] | "__" | "-"+ ) [a-z0-9]+ )*
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex   (sha256: 64 hex digits, sha512: 128, others 32+)

with the name at most 255 characters and lower case outside its registry (as
``docker.io`` reads a first component without ``.`` or ``:`` as a path), and refuses
anything else with one sentence (exit 2) that shows the reference escaped and
shortened.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from manifest.errors import UsageError

if TYPE_CHECKING:
    from manifest.rerun.cluster.options import K8sOptions

MAX_NAME = 255
"""The longest repository name (domain and path) the grammar allows."""
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9A-Fa-f:.]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}


def _is_domain(name: str) -> bool:
    """Whether ``name`` starts with a registry (``docker.io``'s rule: a first component
    with ``.`` or ``:``, or ``localhost``) whose capitals are allowed."""
    first, slash, _ = name.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost"
                            or first.startswith("["))


def _shown(ref: str) -> str:
    from manifest.trust import escape_text

    if len(ref) <= 80:
        return escape_text(ref)
    return f"{escape_text(ref[:60])}… ({len(ref)} characters)"


def check_reference(ref: str, where: str = "--image") -> str:
    """``ref`` when it is a valid image reference (see the module docstring); else one
    sentence (:class:`~manifest.errors.UsageError`) naming ``where`` it came from."""
    match = _REFERENCE.fullmatch(ref) if len(ref) <= 4 * MAX_NAME else None
    problem = None
    if match is None:
        problem = "is not an image reference (REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST])"
    elif len(match.group("name")) > MAX_NAME:
        problem = f"names a repository longer than {MAX_NAME} characters"
    elif not _is_domain(match.group("name")) and match.group("name") != match.group(
            "name").lower():
        problem = "names a repository in capitals (a repository name is lower case)"
    elif match.group("digest"):
        algorithm, _, hex_digits = match.group("digest").partition(":")
        want = _HEX_LENGTH.get(algorithm)
        if want is not None and len(hex_digits) != want:
            problem = f"has a {algorithm} digest of {len(hex_digits)} hex digits, not {want}"
    if problem is not None:
        raise UsageError(f"the container image {_shown(ref)} ({where}) {problem}; refusing "
                         "to render it into a pod spec.")
    return ref


def image_for(options: K8sOptions, recorded_image: str | None) -> str:
    """The pods' image: ``--image`` (or ``[tool.manifest.executors.k8s] image``), else the
    container image the manifest recorded (``env.container.image_digest``) when it names a
    repository (``registry/train@sha256:…``). A bare ``sha256:…`` (podman's image id) is
    not something a node can pull: it, or no recorded image, is one sentence (exit 2)."""
    if options.image:
        return check_reference(options.image)
    if recorded_image and not recorded_image.startswith("sha256:"):
        return check_reference(recorded_image, "recorded in env.container.image_digest")
    if recorded_image:
        raise UsageError(f"--on k8s needs an image a node can pull: the manifest recorded "
                         f"only the image id {recorded_image}; pass --image "
                         f"REPOSITORY@{recorded_image}.")
    raise UsageError("--on k8s needs an image: --image, [tool.manifest.executors.k8s] image, "
                     "or a manifest that recorded its container image "
                     "(MANIFEST_CONTAINER_IMAGE_DIGEST=registry/train@sha256:… at capture).")


def with_recorded_image(options: K8sOptions, recorded_image: str | None) -> K8sOptions:
    """``options`` with the image decided (:func:`image_for`) before anything runs, so the plan
    shows it and a missing one stops the verb before a workspace is built."""
    return replace(options, image=image_for(options, recorded_image))
