from __future__ import annotations

import pytest

from orchestrator.deliveries.image_types import BMP, GIF, ICO, JPEG, PNG, TIFF, WEBP, sniff_image


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", PNG),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", JPEG),
        (b"GIF89a\x01\x00", GIF),
        (b"GIF87a\x01\x00", GIF),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", WEBP),
        (b"BM\x36\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00", BMP),
        (b"II*\x00\x08\x00", TIFF),
        (b"\x00\x00\x01\x00\x01\x00\x10\x10", ICO),
    ],
)
def test_known_images(head: bytes, expected) -> None:
    assert sniff_image(head) is expected


@pytest.mark.parametrize(
    "head",
    [b"", b"<svg xmlns='http://www.w3.org/2000/svg'/>", b"%PDF-1.7", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"BM", b"\x89PNX", b"hello"],
)
def test_everything_else_is_not_an_image(head: bytes) -> None:
    assert sniff_image(head) is None
