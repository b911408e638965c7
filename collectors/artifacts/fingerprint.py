"""Python traceback parsing and fingerprints that stay equal for the same bug on other nodes, ranks
and attempts.

A fingerprint hashes the exception type, the message with its variable parts replaced (addresses,
hosts and ports, paths, hex ids, numbers: ranks, pids, steps, sizes), and the innermost frames as
(normalised file, function): line numbers are left out (the same frames on a node with a patched
copy still match), files are reduced to their path inside site-packages or to their base name
(install prefixes, checkouts and temporary directories differ between nodes). Only the innermost
frames count, and start-up frames (module level, runpy, torch's @record wrapper) are left out,
because the same exception is reported with different outer frames by different sources (torch's
error.json starts at the @record wrapper, stderr at <module>). Of the message only its first line
counts: what follows the exception line in a stream may be the message's own continuation or
another writer's line (an atexit print, srun's or a logger's line, another rank's output), and one
bug must not become two by what happened to be written next.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

_ENTRY_PATHS = ("torch/distributed/elastic/multiprocessing/errors/", "runpy.py")
#: how many innermost frames enter the fingerprint
FINGERPRINT_FRAMES = 6

_TRACEBACK_HEADER = "Traceback (most recent call last):"
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+?))?\s*$')
_EXCEPTION_LINE_RE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|"
    r"NotMet|Timeout|Fault)|[A-Za-z_][\w.]*\.[A-Z]\w*)(?::\s?(?P<message>.*))?$"
)
_CHAIN_RE = re.compile(r"^(During handling of the above exception|The above exception was the "
                       r"direct cause)")
#: glog-style lines (torch's C++ and torchrun's logging): "W1130 04:20:25.214000 8192 file.py:1028]
#: ..."
_LOG_LINE_RE = re.compile(r"^\[?[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ ")
#: lines no exception message continues with: Slurm's own (srun, slurmstepd), Python logging's
#: default and timestamped formats, warnings.showwarning's "file.py:12: UserWarning: ..."
_FOREIGN_LINE_RE = re.compile(
    r"^(?:(?:srun|slurmstepd|sbatch|salloc)(?:: |\[)"
    r"|\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:"
    r"|\S+\.py:\d+: \w*Warning: )"
)
#: prefixes torch and torchrun put in front of a worker's lines: "[default2]:[rank2]: ", "[rank2]: "
LINE_PREFIX_RE = re.compile(r"^(?:\[default(?P<local>\d+)\]:)?(?:\[rank(?P<rank>\d+)\]:)?\s?")

_MESSAGE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\[?\b\d{1,3}(?:\.\d{1,3}){3}\]?(?::\d+)?"), "<host>"),
    (re.compile(r"\[?[0-9a-fA-F:]*::[0-9a-fA-F:]*\]?:\d+"), "<host>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (
        re.compile(r"(?:[A-Za-z]:)?(?:/[^\s/:'\"\]\[,)(]+)+/(?P<base>[^\s/:'\"\]\[,)(]+)"),
        r"\g<base>",
    ),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    function: str


@dataclass(frozen=True)
class ParsedTraceback:
    """The last exception of a traceback text: its frames (outermost first), type and message."""

    exception_type: str | None
    message: str
    frames: tuple[Frame, ...]
    text: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.exception_type, self.message, self.frames)


def strip_prefixes(line: str) -> str:
    """A worker line without torchrun's '[defaultN]:' and torch's '[rankN]:' prefixes."""
    return LINE_PREFIX_RE.sub("", line, count=1)


def normalise_path(path: str) -> str:
    """The part of a source path that is the same on every node."""
    path = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    if path.startswith("<"):
        return path
    return path.rsplit("/", 1)[-1]


def is_entry_frame(frame: Frame) -> bool:
    """Start-up plumbing that one source shows and another does not: module level, runpy, torch's
    @record.
    """
    path = normalise_path(frame.filename)
    return (
        frame.function == "<module>" or path.startswith("<frozen") or path.startswith(_ENTRY_PATHS)
    )


def normalise_message(message: str) -> str:
    """The message with addresses, hosts, paths, ids and numbers replaced by placeholders."""
    text = message.strip()
    for pattern, replacement in _MESSAGE_RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


def fingerprint(
    exception_type: str | None,
    message: str,
    frames: tuple[Frame, ...] | list[Frame] = (),
    depth: int = FINGERPRINT_FRAMES,
) -> str:
    """16 hex digits identifying a bug: same type, same normalised message, same innermost frames.
    """
    short_type = (exception_type or "").rsplit(".", 1)[-1]
    first_line = message.strip().split("\n", 1)[0]
    parts = [short_type, normalise_message(first_line)]
    inner = [f for f in frames if not is_entry_frame(f)][-depth:]
    parts.extend(f"{normalise_path(f.filename)}:{f.function}" for f in inner)
    return hashlib.sha1("\n".join(parts).encode("utf-8", "replace")).hexdigest()[:16]


def split_exception_line(line: str) -> tuple[str | None, str]:
    """('ValueError', 'bad value') from 'ValueError: bad value'; (None, line) when it names no
    exception.
    """
    match = _EXCEPTION_LINE_RE.match(line.strip())
    if not match:
        return None, line.strip()
    return match.group("type"), (match.group("message") or "").strip()


def parse_traceback(text: str) -> ParsedTraceback | None:
    """The last traceback of `text` (worker prefixes stripped, any common indentation allowed), or
    None when it holds none. A message continued over several lines is kept until a blank, a log
    line or a line of another writer's known shape (Slurm's, Python logging's, a warning)."""
    found = None
    for found in iter_tracebacks(text.splitlines()):  # noqa: B007 - the last one is wanted
        pass
    return found


def iter_tracebacks(lines: list[str]) -> Iterator[ParsedTraceback]:
    """Every traceback in `lines`, in order; of a chain ("During handling of the above exception
    ...") only the last, the one that was raised."""
    cleaned = [strip_prefixes(line.rstrip("\n")) for line in lines]
    index = 0
    while index < len(cleaned):
        if not cleaned[index].strip().endswith(_TRACEBACK_HEADER):
            index += 1
            continue
        parsed, end = _parse_block(cleaned, index)
        following = next((line.strip() for line in cleaned[end:end + 3] if line.strip()), "")
        if not _CHAIN_RE.match(following):
            yield parsed
        index = max(end, index + 1)


def _parse_block(lines: list[str], start: int) -> tuple[ParsedTraceback, int]:
    frames: list[Frame] = []
    frame_indent = None
    index = start + 1
    while index < len(lines):
        line = lines[index]
        match = _FRAME_RE.match(line)
        if match:
            frames.append(
                Frame(
                    match.group("file"),
                    int(match.group("line")),
                    (match.group("func") or "").strip(),
                )
            )
            frame_indent = _indent(line)
        elif not line.strip() or (frame_indent is not None and _indent(line) > frame_indent):
            pass  # the source line and caret markers under a frame
        else:
            break
        index += 1
    message_lines: list[str] = []
    for line in lines[index:]:
        stripped = line.strip()
        if not stripped or stripped.endswith(_TRACEBACK_HEADER) or _CHAIN_RE.match(stripped) \
                or _LOG_LINE_RE.match(stripped) or _FRAME_RE.match(line) \
                or (message_lines and _FOREIGN_LINE_RE.match(stripped)):
            break
        message_lines.append(stripped)
    end = index + len(message_lines)
    block = "\n".join(lines[start:end])
    if not message_lines:
        return ParsedTraceback(None, "", tuple(frames), block), end
    exception_type, head = split_exception_line(message_lines[0])
    message = "\n".join([head, *message_lines[1:]]).strip()
    return ParsedTraceback(exception_type, message, tuple(frames), block), end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def fingerprint_traceback(text: str) -> str | None:
    parsed = parse_traceback(text)
    return parsed.fingerprint if parsed else None
