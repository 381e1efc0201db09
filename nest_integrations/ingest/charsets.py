"""Text file encodings: which charset a file's bytes are in, and whether they are text at all.

``decode_text`` tries, in order, a byte-order mark (UTF-8/16/32), strict UTF-8, then detection
with ``charset-normalizer`` (cp1252 preferred when it reads the bytes as plausible text); binary
data is refused with a ``DecodeError`` that says why.
"""

from __future__ import annotations

import codecs
import re

__all__ = ["DecodeError", "decode_text"]


_BOMS = (  # longest first: the UTF-32-LE BOM starts with the UTF-16-LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
#: cp1252 (Windows Western, a superset of Latin-1's printable characters) is taken when it reads
#: the bytes as plausible text (charset-normalizer's mess ratio at most this) and no candidate
#: is clearly more plausible: short Western-European text is ambiguous among single-byte
#: code pages, and the detector's first pick there is often a Baltic or DOS page.
_CP1252_MAX_MESS = 0.2
_CP1252_MARGIN = 0.1


class DecodeError(ValueError):
    """Bytes that are not text in any detectable encoding."""


def decode_text(data: bytes) -> tuple[str, str]:
    """``(text, encoding)`` of a text file's bytes.

    In order: a byte-order mark (UTF-8/16/32; the BOM is not part of the text), strict UTF-8,
    then detection with ``charset-normalizer`` (cp1252 preferred when it reads the bytes as
    plausible text, see ``_CP1252_MAX_MESS``). The encoding is returned as Python's codec
    name (``"utf-8"``, ``"cp1252"``, ``"utf-16-le"``, ``"cp932"``, ...).

    Raises:
        DecodeError: binary data (NUL bytes outside UTF-16/32, control characters) or no
            encoding detected.
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            try:
                return _checked(data[len(bom) :].decode(name), name), name
            except UnicodeDecodeError as exc:
                raise DecodeError(
                    f"starts with a {name} byte-order mark but is not {name} text "
                    f"(invalid byte at offset {exc.start + len(bom)})"
                ) from exc
    try:
        return _checked(data.decode("utf-8"), "utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        utf8_error = f"invalid UTF-8 byte 0x{data[exc.start]:02x} at offset {exc.start}"
    name = _detect(data, utf8_error)
    return _checked(data.decode(name), name), name


def _detect(data: bytes, utf8_error: str) -> str:
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    has_nul = b"\x00" in data
    if has_nul:  # only UTF-16/32 text has NUL bytes
        if best is not None and codecs.lookup(best.encoding).name.startswith(("utf-16", "utf-32")):
            return codecs.lookup(best.encoding).name
        raise DecodeError("binary file (contains NUL bytes); expected text")
    lossy = data.decode("utf-8", errors="replace")
    bad = lossy.count("\ufffd")
    good = sum(1 for ch in lossy if ord(ch) > 0x7F) - bad
    if good >= max(1, bad):  # UTF-8 with a few broken bytes: any other reading is mojibake
        raise DecodeError(
            f"not valid UTF-8 ({utf8_error}; {bad} invalid byte sequence(s), while "
            f"{good} non-ASCII characters are valid UTF-8); fix those bytes or re-save the "
            "file as UTF-8"
        )
    try:
        western = data.decode("cp1252")
    except UnicodeDecodeError:
        western = None
    if western is not None:
        mess = _mess(western)
        if mess <= _CP1252_MAX_MESS and (best is None or mess <= best.chaos + _CP1252_MARGIN):
            return "cp1252"
    if best is None:
        raise DecodeError(
            f"binary file or unknown text encoding ({utf8_error}, and no other encoding "
            "detected); convert it to UTF-8 first, e.g. `iconv -f ENCODING -t UTF-8`"
        )
    return codecs.lookup(best.encoding).name


def _mess(text: str) -> float:
    try:
        from charset_normalizer.md import mess_ratio
    except ImportError:  # pragma: no cover - internal module moved: trust the detector alone
        return 1.0
    return float(mess_ratio(text, 1.0))


_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")


def _checked(text: str, encoding: str) -> str:
    """``text`` unless it looks binary: a NUL character, or (text decoded with a detected or
    BOM-given encoding, not plain UTF-8) control characters in more than 1% of the first 64K
    characters. ESC is allowed (ANSI colours in logs)."""
    if "\x00" in text:
        raise DecodeError(f"binary file (NUL characters in the text decoded as {encoding})")
    if encoding != "utf-8":
        head = text[:65536]
        if len(_CONTROL.findall(head)) > max(2, len(head) // 100):
            raise DecodeError(
                f"binary file (control characters in the text decoded as {encoding}); "
                "expected text"
            )
    return text
