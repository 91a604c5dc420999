"""The JSON Schema of the manifest, generated from the pydantic models.

``schemas/manifest.v1.schema.json`` is this text, checked in; a test fails
when the models and the file drift apart.
"""

from __future__ import annotations

import json

from manifest.models import Manifest


def schema_text() -> str:
    schema = Manifest.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://manifest.dev/schemas/manifest.v1.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
