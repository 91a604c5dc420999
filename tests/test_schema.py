"""The checked-in JSON Schema is exactly what the models generate; the CLI prints it."""

from __future__ import annotations

import json
from pathlib import Path

from manifest import __version__
from manifest.models import Manifest
from manifest.schema import schema_text
from tests.conftest import REPO_ROOT, assert_one_sentence, run_cli

SCHEMA_FILE = REPO_ROOT / "schemas" / "manifest.v1.schema.json"
REGENERATE = "regenerate with: manifest schema -o schemas/manifest.v1.schema.json"


def test_checked_in_schema_matches_the_models() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), REGENERATE


def test_schema_describes_every_section() -> None:
    schema = json.loads(SCHEMA_FILE.read_bytes())
    fields = {f.alias or name for name, f in Manifest.model_fields.items()}
    assert set(schema["properties"]) == fields
    assert set(schema["required"]) == fields
    assert schema["additionalProperties"] is False
    assert schema["properties"]["schema"]["const"] == "manifest/v1"


def test_cli_prints_the_schema(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli("schema", cwd=tmp_path, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.text == SCHEMA_FILE.read_text(encoding="utf-8")
    assert result.stderr == ""
    out = tmp_path / "schema.json"
    result = run_cli("schema", "-o", str(out), cwd=tmp_path, env=cli_env)
    assert result.returncode == 0
    assert result.stdout == b""
    assert out.read_bytes() == SCHEMA_FILE.read_bytes()


def test_version(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli("--version", cwd=tmp_path, env=cli_env)
    assert result.returncode == 0
    assert result.text.strip() == f"manifest {__version__}"


def test_unknown_option_is_one_sentence_exit_2(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli("capture", "--no-such-option", cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    assert result.stdout == b""
    assert_one_sentence(result.stderr)
    assert "--no-such-option" in result.stderr


def test_no_verb_prints_help_and_exits_2(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli(cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    assert result.stdout == b""
    assert "usage: manifest" in result.stderr
    assert "Traceback" not in result.stderr
