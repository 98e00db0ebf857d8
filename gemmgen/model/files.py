"""Reading the files a user names (configurations, suites, replayed timings): every failure is one InvalidInput.

A hostile or mistaken file fails here with the rule it breaks, never deeper in with a UnicodeDecodeError (a
binary file), a RecursionError (nesting thousands deep), a ValueError (an integer of more than 4,300 digits) or
an endless read (/dev/zero).
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
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


class _DuplicateKey(Exception):
    """A mapping names one key twice (raised inside the YAML loader, turned into InvalidInput by load_yaml)."""

    def __init__(self, key: object, line: int):
        self.key, self.line = key, line
        super().__init__(key, line)


_LOADER = None


def _strict_loader():
    """yaml.SafeLoader refusing a key given twice in one mapping: PyYAML keeps the last silently, so a second
    `shapes:` would drop the first list without a word."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class StrictLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):
                if isinstance(node, yaml.MappingNode):
                    seen = set()
                    for key_node, _ in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may be overridden
                            continue
                        key = self.construct_object(key_node, deep=True)
                        try:
                            if key in seen:
                                raise _DuplicateKey(key, key_node.start_mark.line + 1)
                            seen.add(key)
                        except TypeError:  # an unhashable key: the base loader says so
                            pass
                return super().construct_mapping(node, deep)

        _LOADER = StrictLoader
    return _LOADER


def load_yaml(what: str, text: str, source: str):
    """YAML (or JSON, which is YAML) parsed safely, or InvalidInput naming `source`."""
    import yaml  # lazily: the runtime imports the model and must not need PyYAML

    try:
        return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise InvalidInput(f"{what} must not give a key twice in one mapping", source,
                           f"{exc.key!r} again at line {exc.line}") from None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{what} must be valid YAML or JSON", source, str(exc).splitlines()[0]) from None
    except RecursionError:
        raise InvalidInput(f"{what} must not nest so deeply", source) from None
    except ValueError as exc:  # an integer too long for int()
        raise InvalidInput(f"{what} must be valid YAML or JSON", source, str(exc).splitlines()[0][:120]) from None


def load_json(what: str, text: str, source: str):
    """JSON parsed, or InvalidInput naming `source`."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InvalidInput(f"{what} must not give a key twice in one object", source, repr(exc.key)) from None
    except RecursionError:
        raise InvalidInput(f"{what} must not nest so deeply", source) from None
    except ValueError as exc:
        raise InvalidInput(f"{what} must be valid JSON", source, str(exc).splitlines()[0][:120]) from None


def _unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice (json keeps the last silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key, 0)
        out[key] = value
    return out


def _unusable_dir(path: Path) -> "str | None":
    """Why `path` cannot be (made) a writable folder, or None: created with its parents and probed with a
    temporary file, so a read-only disk or a permission shows here too."""
    for part in (path, *path.parents):  # mkdir says "File exists" where a file stands in the way: wrong reason
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                return os.strerror(errno.ENOTDIR)
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    except ValueError as exc:  # a NUL byte in the path
        return str(exc)
    return None


def writable_dir(rule: str, path: "str | Path") -> Path:
    """`path` as a folder that exists and takes files, or InvalidInput(rule, path, why): checked before long work,
    so a bad path costs a second rather than a finished run."""
    path = Path(path)
    why = _unusable_dir(path)
    if why:
        raise InvalidInput(rule, str(path), why)
    return path


def writable_file(rule: str, path: "str | Path") -> Path:
    """`path` as a file that can be written (its folder created), or InvalidInput(rule, path, why); as
    writable_dir, before long work."""
    path = Path(path)
    why = os.strerror(errno.EISDIR) if path.is_dir() else _unusable_dir(path.parent)
    if why:
        raise InvalidInput(rule, str(path), why)
    return path


__all__ = ["MAX_FILE_BYTES", "load_json", "load_yaml", "read_text", "writable_dir", "writable_file"]
