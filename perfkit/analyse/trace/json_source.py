"""The decompressed text of a JSON trace file, read in pieces that are never the whole file.

A Kineto trace is one JSON object per rank whose ``traceEvents`` array holds nearly all of it
(34.8 MB of text for 109,123 events in HTA's ``trace_diff/control.json.gz``). This source reads
the file in chunks (gzip detected from its first bytes) and offers two ways through that array:

- :meth:`JsonSource.runs`: the array cut into runs of whole events, each decoded at once by
  msgspec (a typed decoder that skips the fields it is not asked for: 67 ms for that file's 35 MB,
  where decoding each event into a dict with :mod:`json`'s C scanner takes 0.5 s). A run ends at
  a ``}`` followed by ``,`` and ``{`` (or by the array's ``]``). Such a place can lie inside a
  string or a nested object; the decode proves it does not: JSON is read left to right, so a run
  that starts at a top-level value decodes as an array only if it ends at one too. A cut that
  fails to decode is moved back to the previous candidate; where none works (a single event larger
  than a run, or malformed text), the caller goes on with :meth:`items`.
- :meth:`JsonSource.items`: one value at a time with :mod:`json`'s C scanner, for whatever
  :meth:`runs` leaves, and the error messages of malformed text.
"""

from __future__ import annotations

import codecs
import json
import re
import zlib

import msgspec

from perfkit.core.errors import BadInputError

try:  # ISA-L's inflate (python-isal): zlib's API and stream, ~6x its speed (Qwen MI300X: 14 -> 2.3 ms)
    from isal import isal_zlib as _inflating
except ImportError:  # no isal wheel for this platform: the standard library's, the same bytes
    _inflating = zlib

__all__ = ["JsonSource"]

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_BYTES = 1 << 18
_RUN_CHARS = 1 << 18  # text decoded at once by runs(): bounds the memory a run's events hold
_MAX_VALUE_CHARS = 64 << 20  # one JSON value (an event, a metadata block) larger than this is not a trace
_WS = re.compile(rb"[ \t\n\r]*")
_WS_TEXT = re.compile(r"[ \t\n\r]*")
#: Where a run of array values may end: a '}' before ', {' or before the array's ']'.
_RUN_END = re.compile(rb"\}[ \t\n\r]*(?:,[ \t\n\r]*(?=\{)|\])")
_CUT_TRIES = 4  # candidates tried, last first, before a run gives up to items()


class JsonSource:
    """The decompressed bytes of a trace file in a sliding buffer, with a cursor (byte offsets).

    The buffer is a ``bytearray``: chunks are appended in place and what was consumed is dropped
    in place, and :meth:`runs` hands msgspec a view of it, so the text of a trace is copied once
    (out of the inflater) on its way to the decoder. The :mod:`json` scanner paths decode the bytes they
    read to ``str``.
    """

    def __init__(self, path: str):
        self.path = path
        self._chunks = _inflate(path)
        self.buf = bytearray()
        self.pos = 0
        self.dropped = 0  # bytes dropped from the buffer's front: self.dropped + self.pos is the file offset
        self.eof = False
        self.array_done = False
        self._scan = json.scanner.make_scanner(json.JSONDecoder())

    def close(self) -> None:
        self._chunks.close()  # a generator: closes the file

    def _fill(self, min_ahead: int) -> None:
        if self.pos > max(len(self.buf) // 2, 1):  # drop what was consumed but the byte before the cursor
            del self.buf[:self.pos - 1]
            self.dropped += self.pos - 1
            self.pos = 1
        while not self.eof and len(self.buf) - self.pos < min_ahead:
            try:
                chunk = next(self._chunks)
            except (OSError, EOFError, _inflating.error) as err:
                raise BadInputError(f"{self.path}: not a readable JSON trace ({err})") from None
            self.eof = not chunk
            self.buf += chunk

    def _bad(self, what: str) -> BadInputError:
        return BadInputError(f"{self.path}: {what} at byte {self.dropped + self.pos}")

    def skip_ws(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return chr(self.buf[self.pos]) if self.pos < len(self.buf) else ""
            self._fill(1)

    def expect(self, chars: str) -> str:
        c = self.skip_ws()
        if not c or c not in chars:
            raise self._bad(f"not a Chrome/Kineto JSON trace (expected one of {chars!r}, found {c!r})")
        self.pos += 1
        return c

    def _text(self, ahead: int) -> tuple[str, bool]:
        """The buffer's text from the cursor, up to ``ahead`` bytes (a character cut at the end is
        left for later), and whether it is all the rest of the file."""
        self._fill(ahead)
        try:
            text, used = codecs.utf_8_decode(self.buf[self.pos:self.pos + ahead], "strict", False)
        except UnicodeDecodeError as err:
            raise BadInputError(f"{self.path}: not a readable JSON trace ({err})") from None
        return text, self.eof and self.pos + used == len(self.buf)

    def _advance(self, text: str, chars: int) -> None:
        """Move the cursor past the first ``chars`` characters of ``text`` (decoded from it)."""
        self.pos += chars if text.isascii() else len(text[:chars].encode())

    def value(self):
        """Decode the JSON value at the cursor, reading more text until it is complete."""
        self.skip_ws()
        ahead = 1 << 16
        while True:
            text, whole = self._text(ahead)
            try:
                obj, end = self._scan(text, 0)
            except (StopIteration, ValueError):
                # Incomplete in the buffer, or malformed: read more unless there is no more.
                if whole or ahead > _MAX_VALUE_CHARS:
                    raise self._bad("not a valid JSON trace (bad value)") from None
                ahead *= 4
                continue
            if end == len(text) and not whole:
                ahead *= 4  # a number may go on in the next chunk
                continue
            self._advance(text, end)
            return obj

    def items(self):
        """The values of the JSON array whose '[' was just consumed, one at a time; consumes the ']'.

        Values are scanned from a window of decoded text; one that the window cuts (or malformed
        text) goes through :meth:`value` and :meth:`expect`, which read on or say what is wrong.
        """
        scan, ws = self._scan, _WS_TEXT.match
        if self.skip_ws() == "]":
            self.pos += 1
            return
        while True:
            self.skip_ws()
            text, whole = self._text(_CHUNK_BYTES)
            i, after_value = 0, False  # i: where the next value starts in text
            while True:
                try:
                    obj, end = scan(text, i)
                except (StopIteration, ValueError):
                    break
                if end == len(text) and not whole:
                    break
                yield obj
                j = ws(text, end).end()
                c = text[j:j + 1]
                if c == ",":
                    i = ws(text, j + 1).end()
                    continue
                self._advance(text, j)
                if c == "]":
                    self.pos += 1
                    return
                after_value = True  # the window ends after a value, or the text is malformed
                break
            if not after_value:
                self._advance(text, i)
                if i > 0:
                    continue  # a new window from this value's start
                yield self.value()  # longer than a window, or malformed: value() reads on or says so
            if self.expect(",]") == "]":
                return

    def runs(self, decode):
        """``decode(view)`` of successive runs of whole values of the JSON array whose '[' was just
        consumed, each run at most ``_RUN_CHARS`` long and given as the bytes of a JSON array;
        ``decode`` raises ``msgspec.DecodeError`` where the view is not one. Sets
        :attr:`array_done` when the array's ']' was consumed; otherwise the cursor is at the next
        value, for :meth:`items`.
        """
        self.array_done = False
        while True:
            if self.skip_ws() != "{":
                return  # the end of the array, or something items() must judge
            ahead = _RUN_CHARS
            while True:
                self._fill(ahead)
                buf, pos = self.buf, self.pos
                limit = min(len(buf), pos + ahead)
                cuts = [m for m in _RUN_END.finditer(buf, max(pos, limit - (1 << 16)), limit)] or \
                    [m for m in _RUN_END.finditer(buf, pos, limit)]
                if cuts or self.eof or ahead >= _MAX_VALUE_CHARS:
                    break
                ahead *= 4  # one event longer than a run: read on
            for m in cuts[:-_CUT_TRIES - 1:-1]:
                end = m.start() + 1  # just after the run's last '}'
                values = self._decode_between(decode, pos, end)
                if values is None:
                    continue
                self.pos = m.end()
                yield values
                if m.group().endswith(b"]"):
                    self.array_done = True
                    return
                break
            else:
                return  # no cut decodes: items() goes on from here

    def _decode_between(self, decode, start: int, end: int):
        """``decode`` of ``[`` + buf[start:end] + ``]``, in place: the consumed byte before ``start``
        and the byte at ``end`` (a blank, ',' or ']' after the run) stand in for the brackets
        while it decodes. None where that is not a JSON array."""
        buf = self.buf
        before, after = buf[start - 1], buf[end]
        buf[start - 1], buf[end] = 0x5B, 0x5D  # '[' and ']'
        try:
            with memoryview(buf) as whole, whole[start - 1:end + 1] as run:
                return decode(run)
        except msgspec.DecodeError:
            return None
        finally:
            buf[start - 1], buf[end] = before, after


def _inflate(path: str):
    """The file's bytes, decompressed where it is gzip (any number of members), in chunks of at
    most ``_CHUNK_BYTES``; b"" at the end. The inflater checks each member's CRC itself."""
    with open(path, "rb") as raw:
        block = raw.read(_CHUNK_BYTES)
        if not block.startswith(_GZIP_MAGIC):
            while block:
                yield block
                block = raw.read(_CHUNK_BYTES)
            yield b""
            return
        inflater = _inflating.decompressobj(wbits=31)
        while True:
            out = inflater.decompress(block, _CHUNK_BYTES)
            while inflater.unconsumed_tail:  # bounded output: at most a chunk at a time
                if out:
                    yield out
                out = inflater.decompress(inflater.unconsumed_tail, _CHUNK_BYTES)
            if out:
                yield out
            if inflater.eof:
                block = inflater.unused_data + raw.read(_CHUNK_BYTES)
                if not block.strip(b"\x00"):  # gzip's trailing padding
                    break
                inflater = _inflating.decompressobj(wbits=31)  # the next member
                continue
            block = raw.read(_CHUNK_BYTES)
            if not block:
                raise EOFError("the compressed file ends before its end-of-stream marker")
    yield b""
