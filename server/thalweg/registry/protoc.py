"""Compile ``.proto`` text (as a registry stores it) into a FileDescriptorSet.

Uses the ``protoc`` bundled in ``grpcio-tools`` (the ``protobuf`` extra), in-process, with
the well-known types (``google/protobuf/timestamp.proto``...) on the include path.
"""

from __future__ import annotations

import importlib.resources
import tempfile
from pathlib import Path

from thalweg.registry.errors import RegistryError


def compile_proto(text: str, references: dict[str, str] | None = None) -> bytes:
    """A FileDescriptorSet (with imports) whose last file is ``text``."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise RegistryError(
            "Protobuf schemas from a registry need the 'protobuf' extra: "
            "pip install 'thalweg[protobuf]'"
        ) from exc
    includes = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for name, body in (references or {}).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(body, encoding="utf-8")
        (root / "schema.proto").write_text(text, encoding="utf-8")
        out = root / "set.pb"
        code = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"-I{includes}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                str(root / "schema.proto"),
            ]
        )
        if code != 0 or not out.exists():
            raise RegistryError("the registry's .proto schema does not compile")
        return out.read_bytes()
