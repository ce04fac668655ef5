"""An uploaded file's text: its type judged by its content, never by its name, and its chunks.

A PDF is one whose header (`%PDF-`) opens the file and that pypdf parses; its text is what
pypdf extracts, page by page. Anything else must be text: UTF-8 with no NUL byte. The file's
name only tells Markdown from plain text, which the model reads alike. Refusals are
`ServiceError`s in the API's one shape: 415 for a type we do not take, 422 for a PDF we
cannot read (malformed, encrypted, or with no text to extract, as a scan is).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

from pypdf import PasswordType, PdfReader

from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import Attachment

PDF_MAGIC = b"%PDF-"
# Readers take a header anywhere in the first 1024 bytes (some writers put junk before it);
# there it marks a PDF only if the file is not text, which may well quote a PDF's header.
PDF_HEADER_WINDOW = 1024
MARKDOWN_SUFFIXES = (".md", ".markdown")

# pypdf logs every oddity of a malformed file as a warning; the refusal says enough.
logging.getLogger("pypdf").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Extracted:
    """What a file holds for the model: its kind and its text."""

    kind: str
    text: str


def extract_text(*, name: str, data: bytes) -> Extracted:
    """The kind and text of the uploaded file `data` called `name`, or a refusal."""
    if data.startswith(PDF_MAGIC) or (
        PDF_MAGIC in data[:PDF_HEADER_WINDOW] and _decoded(data) is None
    ):
        text = _pdf_text(data)
        kind = Attachment.Kind.PDF
    else:
        text = _plain_text(data)
        markdown = name.lower().endswith(MARKDOWN_SUFFIXES)
        kind = Attachment.Kind.MARKDOWN if markdown else Attachment.Kind.TEXT
    if not text.strip():
        raise ServiceError(
            ErrorCode.NO_TEXT_IN_ATTACHMENT,
            f"{name} holds no text to read.",
            status=422,
        )
    return Extracted(kind=kind, text=text)


def _decoded(data: bytes) -> str | None:
    """`data` as text if it is UTF-8 (a byte-order mark dropped) with no NUL; else None."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _plain_text(data: bytes) -> str:
    text = _decoded(data)
    if text is None:
        raise ServiceError(
            ErrorCode.UNSUPPORTED_ATTACHMENT,
            "Only text, Markdown and PDF files can be attached: this file is neither UTF-8 "
            "text nor a PDF.",
            status=415,
        )
    return text


def _pdf_text(data: bytes) -> str:
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise ServiceError(
                ErrorCode.ENCRYPTED_PDF,
                "This PDF is protected by a password; attach one without it.",
                status=422,
            )
        pages = [page.extract_text() or "" for page in reader.pages]
    except ServiceError:
        raise
    except Exception as exc:
        # A malformed file can fail anywhere in the parser, with any exception: whatever it
        # is, the file is not a PDF we can read, and the user hears so.
        raise ServiceError(
            ErrorCode.UNREADABLE_PDF, "This PDF could not be read.", status=422
        ) from exc
    return "\n\n".join(page.strip() for page in pages if page.strip())


# Where a chunk prefers to end, best first: a paragraph, a line, a sentence, a word.
_BREAKS = ("\n\n", "\n", ". ", " ")


def chunk_offsets(text: str, *, size: int) -> list[list[int]]:
    """`text` cut into pieces of at most `size` characters, as `[start, end)` offsets that
    cover it in order. A piece ends at the last paragraph, line, sentence or word break in
    its second half where there is one, so a chunk reads as a whole."""
    chunks: list[list[int]] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            half = start + size // 2
            for mark in _BREAKS:
                cut = text.rfind(mark, half, end)
                if cut >= 0:
                    end = cut + len(mark)
                    break
        if text[start:end].strip():
            chunks.append([start, end])
        start = end
    return chunks
