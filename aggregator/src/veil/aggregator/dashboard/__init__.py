"""The built-in dashboard: one static page that polls /v1/estimates and draws the estimates.

    Aggregator(config, pages=dashboard.pages())      # serves /, /dashboard.js, /dashboard.css

Hand-written HTML, CSS and JavaScript (SVG bars, no libraries, no build step, nothing fetched
from anywhere but the aggregator itself), kept beside this module as package data.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from importlib.resources import files

__all__ = ["ASSETS", "pages"]

# path -> (file in this package, content type)
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


@cache
def _read(name: str) -> bytes:
    return files(__name__).joinpath(name).read_bytes()


def pages() -> dict[str, tuple[str, Callable[[], bytes]]]:
    """The dashboard's routes for HttpListener: path -> (content type, body factory)."""
    return {path: (content_type, partial(_read, name)) for path, (name, content_type) in ASSETS.items()}
