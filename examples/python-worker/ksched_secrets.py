"""Opens values a producer sealed for a job's tenant (docs/security.md#secrets).

The format, as ksched-secrets writes it: `kse1.<kid>.<wrapped data key>.<sealed value>`, both
parts base64url without padding, each `nonce(12) || ciphertext || tag(16)` under AES-256-GCM.
The data key is sealed with the tenant's key `kid` from the keyring, associated data
`ad("ksched/dek/v1", tenant, kid)`; the value with the data key, associated data
`ad("ksched/env/v1", tenant, env_key)` or `ad("ksched/payload/v1", tenant)`, where `ad` joins
its parts each preceded by its length as 4 bytes big-endian.
"""

import base64
import json
import os
import stat

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "kse1."
NONCE = 12


class Unavailable(Exception):
    """A sealed value that does not open here: no key, or altered."""


def _b64(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _ad(*parts):
    out = b""
    for p in parts:
        p = p.encode() if isinstance(p, str) else p
        out += len(p).to_bytes(4, "big") + p
    return out


def _open(key, sealed, ad):
    return AESGCM(key).decrypt(sealed[:NONCE], sealed[NONCE:], ad)


def is_sealed(value):
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode()
        except UnicodeDecodeError:
            return False
    if not isinstance(value, str) or not value.startswith(PREFIX):
        return False
    parts = value[len(PREFIX):].split(".")
    if len(parts) != 3 or not parts[0]:
        return False
    try:
        wrapped, body = _b64(parts[1]), _b64(parts[2])
    except ValueError:
        return False
    return len(wrapped) == NONCE + 32 + 16 and len(body) >= NONCE + 16


class Keyring:
    """A keyring file, read again when it changes (a rotation or a shredding reaches us)."""

    def __init__(self, path):
        self.path = path
        self.stamp = None
        self.tenants = {}
        self._load()

    def _load(self):
        st = os.stat(self.path)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SystemExit(f"keyring {self.path}: others may read it: chmod 600 {self.path}")
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self.stamp:
            with open(self.path, encoding="utf-8") as f:
                self.tenants = json.load(f)["tenants"]
            self.stamp = stamp

    def open(self, tenant, sealed, env_key=None):
        """The plaintext bytes of `sealed`, an env value (env_key) or the payload (None)."""
        self._load()
        _, kid, wrapped, body = sealed.split(".")
        key = self.tenants.get(tenant, {}).get("keys", {}).get(kid)
        if key is None:
            raise Unavailable(f"no key {kid} for tenant {tenant}: never given here, retired or shredded")
        field = _ad("ksched/env/v1", tenant, env_key) if env_key is not None else _ad("ksched/payload/v1", tenant)
        try:
            dek = _open(_b64(key), _b64(wrapped), _ad("ksched/dek/v1", tenant, kid))
            return _open(dek, _b64(body), field)
        except Exception as e:  # InvalidTag: altered, or sealed for another tenant or field
            raise Unavailable(f"a sealed value of tenant {tenant} does not open with key {kid}") from e


def open_job(keyring, job):
    """(env, payload) of a job with its sealed values opened; Unavailable if one cannot be."""
    tenant = job["tenant_id"]
    env = {}
    for k, v in job["env"].items():
        if k.startswith("$") and is_sealed(v):
            if keyring is None:
                raise Unavailable("the job carries sealed values and this worker has no --keyring")
            env[k] = keyring.open(tenant, v, env_key=k).decode()
        else:
            env[k] = v
    payload = bytes(job["payload"])
    if is_sealed(payload):
        if keyring is None:
            raise Unavailable("the job's payload is sealed and this worker has no --keyring")
        payload = keyring.open(tenant, payload.decode())
    return env, payload
