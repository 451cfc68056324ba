"""Append-only metrics.jsonl that stays consistent across kill-and-resume.

A record is one line written by one append and fsynced before the loop goes on, so a crash
can only damage the record being written: the last line. Hence the rules:
  - an unreadable *last* line is a torn write; `read` drops it and the resume's
    `truncate_after` rewrites the file without it;
  - an unreadable line with good records after it cannot come from a crash of this writer
    (it is damage or a foreign edit): `read` raises `CorruptMetricsError` naming the file and
    line, instead of silently dropping the records that follow;
  - a failed append (disk full) is rolled back to the previous end of the file, so no half
    record is left for the next resume to trip on.
"""
from __future__ import annotations

import errno
import json
import os


from jaxrl_scale.numbers import to_jsonable

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class CorruptMetricsError(ValueError):
    """metrics.jsonl has an unreadable line before its last one."""


# The one JSON sanitizer (numpy/JAX to Python, NaN/inf to null); the old name stays for
# tests/test_faults.py's torn-write hook.
_jsonable = to_jsonable


def parse_records(lines: list[bytes], path: str = "metrics.jsonl") -> list[dict]:
    """The records of metrics.jsonl's raw `lines`; a torn last line is dropped (module doc).

    Bytes, not text: the writer emits ASCII JSON, so a byte that is not valid UTF-8 is damage
    and must fail this line's parse (UnicodeDecodeError is a ValueError), not the whole read.

    Raises CorruptMetricsError for an unreadable line that has records after it.
    """
    numbered = [(i, line.strip()) for i, line in enumerate(lines, 1) if line.strip()]
    out = []
    for k, (i, line) in enumerate(numbered):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not a record")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            if k == len(numbered) - 1:
                break  # the torn last line of a kill mid-write
            raise CorruptMetricsError(
                f"{path}, line {i}: unreadable record ({e}) with {len(numbered) - 1 - k} "
                f"record(s) after it. A crash can only tear the last line, so the file was "
                f"damaged or edited. Fix: repair or delete line {i} by hand, then rerun; "
                f"nothing is dropped automatically.") from e
        out.append(rec)
    return out


def _disk_full(path: str, e: OSError, what: str) -> OSError:
    return OSError(e.errno, f"Disk full while {what} {path} ({e.strerror}); the file is left "
                            f"as it was before. Fix: free space on that filesystem and rerun "
                            f"the same command; the run resumes from its last checkpoint.")


class MetricsLog:
    """One JSON record per line; every write is flushed and fsynced (a kill loses nothing)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            return parse_records(f.readlines(), self.path)

    def truncate_after(self, step: int) -> list[dict]:
        """Keep records with step <= `step` (the resumed checkpoint); drop the rest atomically.

        The new file is written beside the old one, fsynced and renamed over it, so a crash
        or a full disk here leaves either the old file or the new one, never a mix.
        """
        kept = [r for r in self.read() if int(r.get("step", -1)) <= step]
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                for r in kept:
                    f.write(json.dumps(r) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if os.path.exists(tmp):
                os.remove(tmp)
            if e.errno in _DISK_FULL_ERRNOS:
                raise _disk_full(self.path, e, "rewriting") from e
            raise
        os.replace(tmp, self.path)
        return kept

    def write(self, record: dict) -> None:
        """Append one record: one line through os.write, then fsync.

        On an error (disk full) the file is cut back to where it ended before this record, so
        it never keeps a half line; the error names the file and the fix.
        """
        data = (json.dumps(_jsonable(record)) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:  # os.write may write less than asked
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, end)
                if e.errno in _DISK_FULL_ERRNOS:
                    raise _disk_full(self.path, e, "appending a record to") from e
                raise
        finally:
            os.close(fd)
