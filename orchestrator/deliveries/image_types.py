"""What kind of image a byte string is, from its first bytes (never from its name).

Chat platforms accept a handful of raster formats as images; `send_image` refuses anything
else, so a misnamed text file or an SVG (a script carrier) never goes out as an image.
"""

from __future__ import annotations

from dataclasses import dataclass

SNIFF_BYTES = 32


@dataclass(frozen=True)
class ImageType:
    media_type: str
    extension: str


PNG = ImageType("image/png", ".png")
JPEG = ImageType("image/jpeg", ".jpg")
GIF = ImageType("image/gif", ".gif")
WEBP = ImageType("image/webp", ".webp")
BMP = ImageType("image/bmp", ".bmp")
TIFF = ImageType("image/tiff", ".tiff")
ICO = ImageType("image/x-icon", ".ico")


def sniff_image(head: bytes) -> ImageType | None:
    """The image type of a file starting with `head` (give at least SNIFF_BYTES), else None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return GIF
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    if len(head) >= 14 and head[:2] == b"BM" and int.from_bytes(head[2:6], "little") >= 14:
        return BMP
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return TIFF
    if head[:4] == b"\x00\x00\x01\x00" and len(head) >= 6 and int.from_bytes(head[4:6], "little") > 0:
        return ICO
    return None
