#!/usr/bin/env python3
"""Mint an Ash context token exactly as Ash does, with the standard library only.

Usage: ash_mint.py SECRET_HEX < claims.json

claims.json is a JSON object of claims (sub, iat, exp, jti, chat_id, ...),
or an array of them: one token a line, in order (one interpreter for many).
iat defaults to now, exp to iat + 300 and jti to 16 random bytes in hex.
The token is printed on stdout.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time

HEADER = {"alg": "HS256", "typ": "ASH_CONTEXT", "ver": 1}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _dumps(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def mint(secret: bytes, claims: dict, ttl: int = 300) -> str:
    payload = dict(claims)
    payload["ver"] = 1
    payload.setdefault("iat", int(time.time()))
    payload.setdefault("exp", payload["iat"] + ttl)
    payload.setdefault("jti", os.urandom(16).hex())
    signing_input = _b64(_dumps(HEADER)) + "." + _b64(_dumps(payload))
    sig = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + _b64(sig)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    secret = bytes.fromhex(sys.argv[1])
    claims = json.load(sys.stdin)
    for c in claims if isinstance(claims, list) else [claims]:
        print(mint(secret, c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
