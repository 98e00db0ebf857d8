"""gemmgen's exceptions. Each carries its context, pickles, and prints as one line.

Errors the user can fix (bad shape, dtype, config, file, URL) derive from UserError: the CLI
prints them as a single line and exits with status 2.
"""
from __future__ import annotations

from dataclasses import dataclass


class GemmgenError(Exception):
    """Root of gemmgen's errors."""


class UserError(GemmgenError):
    """Something the user gave us breaks a rule: printed as one line, exit status 2."""

    exit_code = 2


class MissingTool(UserError):
    """Something gemmgen runs (a library, a binary utility) is not installed: what is missing and how to install it,
    in the subclass's `message`."""

    message = "{what} is not installed ({hint})"

    def __init__(self, what: str, hint: str):
        self.what, self.hint = what, hint
        super().__init__(what, hint)

    def __str__(self) -> str:
        return self.message.format(what=self.what, hint=self.hint)


class InvalidInput(UserError):
    """A value on the command line, in a file or in an API call breaks a rule."""

    def __init__(self, rule: str, value: object, hint: str = ""):
        self.rule, self.value, self.hint = rule, value, hint
        super().__init__(rule, value, hint)

    def __str__(self) -> str:
        text = f"{self.rule}, but got {self.value!r}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass(frozen=True)
class Violation:
    """One feasibility rule a configuration breaks: which rule, the offending value, the limit."""

    rule: str
    value: object
    limit: object

    def __str__(self) -> str:
        return f"{self.rule}: got {self.value}, limit {self.limit}"


class InvalidConfig(UserError):
    """A configuration breaks one or more feasibility rules; every one is listed."""

    def __init__(self, name: str, violations: "list[Violation] | tuple[Violation, ...]"):
        self.name, self.violations = name, tuple(violations)
        super().__init__(name, self.violations)

    def __str__(self) -> str:
        rules = "; ".join(str(v) for v in self.violations)
        return f"configuration {self.name} is infeasible: {rules}"


class NoGpu(UserError):
    """A command needs a GPU and no CUDA driver or device was found."""

    def __init__(self, reason: str, hint: str = ""):
        self.reason, self.hint = reason, hint
        super().__init__(reason, hint)

    def __str__(self) -> str:
        return f"no GPU available: {self.reason}" + (f" ({self.hint})" if self.hint else "")


class CompileError(GemmgenError):
    """NVRTC rejected a kernel. The log travels with the exception."""

    def __init__(self, name: str, options: "tuple[str, ...] | list[str]", log: str, source_path: str = ""):
        self.name, self.options, self.log, self.source_path = name, tuple(options), log, source_path
        super().__init__(name, self.options, log, source_path)

    def __str__(self) -> str:
        first = next((l for l in self.log.splitlines() if "error" in l), self.log.strip()[:200])
        where = f" (source: {self.source_path})" if self.source_path else ""
        return f"NVRTC failed to compile {self.name}: {first}{where}"


class CudaError(GemmgenError):
    """A CUDA driver call returned an error code."""

    def __init__(self, call: str, code: int, name: str, detail: str = ""):
        self.call, self.code, self.name, self.detail = call, code, name, detail
        super().__init__(call, code, name, detail)

    def __str__(self) -> str:
        return f"{self.call} failed with {self.name} ({self.code})" + (f": {self.detail}" if self.detail else "")


class VerificationError(GemmgenError):
    """A kernel ran but its output does not match the reference."""

    def __init__(self, name: str, rel_error: float, threshold: float, detail: str = ""):
        self.name, self.rel_error, self.threshold, self.detail = name, rel_error, threshold, detail
        super().__init__(name, rel_error, threshold, detail)

    def __str__(self) -> str:
        return (f"{self.name} gave a wrong result: relative error {self.rel_error:.3e} > {self.threshold:.1e}"
                + (f" ({self.detail})" if self.detail else ""))
