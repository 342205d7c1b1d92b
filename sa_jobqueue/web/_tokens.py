"""Signed values in cookies: the forms' CSRF token and the message shown after an action.

A CSRF token is a random nonce and its HMAC under the app's secret. The app sets it in a
cookie (``SameSite=Strict``, ``HttpOnly``) and writes the same value into every form; a POST is
accepted only when the form's token equals the cookie's and the signature holds. Another site
can make a browser send the cookie, but cannot read it to put it in the form (double submit);
the signature stops a cookie planted by a sibling subdomain from serving as a token.

The flash message survives one redirect in a cookie of its own, signed so that no other page
can make the dashboard show words it did not write.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Final

CSRF_COOKIE: Final = "sajq_csrf"
CSRF_FIELD: Final = "csrf_token"
FLASH_COOKIE: Final = "sajq_flash"


class Signer:
    """HMAC-SHA256 under one secret, each use under its own purpose."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, purpose: str, value: str) -> str:
        digest = hmac.new(self._secret, f"{purpose}\0{value}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    def valid(self, purpose: str, value: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(purpose, value), signature)

    # -- CSRF --------------------------------------------------------------------------------

    def new_token(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self.sign('csrf', nonce)}"

    def token_valid(self, token: str | None) -> bool:
        if not token or token.count(".") != 1:
            return False
        nonce, signature = token.split(".")
        return self.valid("csrf", nonce, signature)

    def form_accepted(self, cookie: str | None, form_token: str | None) -> bool:
        """Whether a POST carries this browser's token: in its form, equal to its cookie."""
        if not self.token_valid(cookie) or not isinstance(form_token, str):
            return False
        assert cookie is not None
        return hmac.compare_digest(cookie.encode(), form_token.encode())

    # -- flash -------------------------------------------------------------------------------

    def flash(self, ok: bool, text: str) -> str:
        # Without base64's "=" padding: a cookie value holding "=" gets quoted.
        body = base64.urlsafe_b64encode(json.dumps([ok, text]).encode()).decode().rstrip("=")
        return f"{body}.{self.sign('flash', body)}"

    def read_flash(self, cookie: str | None) -> tuple[bool, str] | None:
        if not cookie or cookie.count(".") != 1:
            return None
        body, signature = cookie.split(".")
        if not self.valid("flash", body, signature):
            return None
        try:
            ok, text = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            return None
        return bool(ok), str(text)
