"""Tensors of sharded safetensors: ``model.safetensors.index.json`` and its shards.

The Hugging Face convention for a model too big for one file: shards named
``model-00001-of-00004.safetensors`` beside an index whose ``weight_map``
says which shard holds each tensor. The index is the artifact: its table is
every tensor the map names, read from the shard it names, so it equals the
table of the same state dict saved as one safetensors file.

The index is a file a user can be handed, and its shard names are paths a
loader joins to the directory. Each is held to a plain file name of a regular
file beside the index (``manifest.weights.mapped.plain_member``: no separator,
not ``..``, no link followed), so ``../../home/u/.ssh/id.safetensors`` or a
planted link reads nothing outside the directory. The index is a regular file
of at most :data:`MAX_INDEX` bytes (a 405B-parameter model's index is about
100 KB), read through ``manifest.weights.mapped.read_member``: an index linked
to ``/dev/zero`` has ``st_size`` 0, and a plain ``read_bytes()`` of it ran until
memory was gone.
Each shard is read by the safetensors reader with its own bounds; a tensor the
map names and its shard lacks is malformed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from manifest.weights.bounds import MalformedWeightsError, WeightFileError, short
from manifest.weights.mapped import MappedFile, plain_member, read_member
from manifest.weights.raw import RawTensor
from manifest.weights.safetensors_file import iter_safetensors

INDEX_SUFFIX = ".safetensors.index.json"
MAX_INDEX = 64 << 20


def is_index(path: Path) -> bool:
    return path.name.endswith(INDEX_SUFFIX)


def weight_map(index: Path) -> dict[str, str]:
    """The index's ``weight_map`` (tensor name → shard name), checked for shape only."""
    data = read_member(index, MAX_INDEX, "the index")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise WeightFileError(f"the index is not JSON: {short(str(exc))}") from exc
    mapping = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise MalformedWeightsError("the index has no weight_map of names to shard files")
    return mapping


def shard_paths(index: Path, mapping: dict[str, str] | None = None) -> dict[str, Path]:
    """Each shard the index names, checked to be a regular file beside it."""
    names = (weight_map(index) if mapping is None else mapping).values()
    return {name: plain_member(index.parent, name, "shard") for name in sorted(set(names))}


def iter_sharded(index: Path) -> Iterator[RawTensor]:
    mapping = weight_map(index)
    by_shard: dict[str, set[str]] = {}
    for name, shard in mapping.items():  # once, not once per shard
        by_shard.setdefault(shard, set()).add(name)
    for shard, path in shard_paths(index, mapping).items():
        wanted = by_shard[shard]
        mapped = MappedFile(path)
        try:
            try:
                found = {t.name: t for t in iter_safetensors(mapped.view)}
            except WeightFileError as exc:
                if isinstance(exc, MalformedWeightsError):
                    raise MalformedWeightsError(f"shard {short(shard)}: {exc}") from exc
                raise MalformedWeightsError(f"shard {short(shard)} is not safetensors: "
                                            f"{exc}") from exc
            lacking = sorted(wanted - set(found))
            if lacking:
                raise MalformedWeightsError(f"shard {short(shard)} lacks {short(lacking)}, "
                                            "which the index places there")
            for name in sorted(wanted):
                yield found[name]
        finally:
            found = {}
            mapped.close()
