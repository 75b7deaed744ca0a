"""Schemas from files: ``<dir>/<id>.avsc`` (air-gapped deployments, tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thalweg.registry.errors import RegistryError


class StaticRegistry:
    """Writer schemas by id, loaded once from a directory of ``<id>.avsc`` files."""

    def __init__(self, directory: Path) -> None:
        self._schemas: dict[int, Any] = {}
        for path in sorted(Path(directory).glob("*.avsc")):
            if not path.stem.isdigit():
                raise RegistryError(f"{path}: schema files are named <id>.avsc")
            try:
                self._schemas[int(path.stem)] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise RegistryError(f"{path}: not JSON: {exc}") from exc

    def get(self, schema_id: int) -> Any | None:
        return self._schemas.get(schema_id)

    def fetch(self, schema_id: int) -> Any | None:
        """Same as :meth:`get` (nothing to fetch)."""
        return self.get(schema_id)
