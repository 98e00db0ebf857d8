"""Reading the files a user names (configurations, suites, replayed timings): every failure is one InvalidInput.

A hostile or mistaken file fails here with the rule it breaks, never deeper in with a UnicodeDecodeError (a
binary file), a RecursionError (nesting thousands deep), a ValueError (an integer of more than 4,300 digits) or
an endless read (/dev/zero).
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import InvalidInput

# No configuration, suite or timing file gemmgen reads comes near this; /dev/zero or a disk image does.
MAX_FILE_BYTES = 64 * 2**20


def read_text(what: str, path: "str | Path", max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the file `what` names (e.g. "--config"), or InvalidInput naming the rule."""
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"{what} must name a readable file", str(path), exc.strerror or type(exc).__name__) from None
    except ValueError as exc:  # a NUL byte in the path
        raise InvalidInput(f"{what} must name a readable file", str(path), str(exc)) from None
    if len(raw) > max_bytes:
        raise InvalidInput(f"{what} must be a file of at most {max_bytes // 2**20} MiB", str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} must be UTF-8 text (YAML or JSON), not a binary file", str(path),
                           f"byte {exc.start} is 0x{raw[exc.start]:02x}") from None


def load_yaml(what: str, text: str, source: str):
    """YAML (or JSON, which is YAML) parsed safely, or InvalidInput naming `source`."""
    import yaml  # lazily: the runtime imports the model and must not need PyYAML

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{what} must be valid YAML or JSON", source, str(exc).splitlines()[0]) from None
    except RecursionError:
        raise InvalidInput(f"{what} must not nest so deeply", source) from None
    except ValueError as exc:  # an integer too long for int()
        raise InvalidInput(f"{what} must be valid YAML or JSON", source, str(exc).splitlines()[0][:120]) from None


def load_json(what: str, text: str, source: str):
    """JSON parsed, or InvalidInput naming `source`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidInput(f"{what} must not nest so deeply", source) from None
    except ValueError as exc:
        raise InvalidInput(f"{what} must be valid JSON", source, str(exc).splitlines()[0][:120]) from None


__all__ = ["MAX_FILE_BYTES", "load_json", "load_yaml", "read_text"]
