"""The TLS files a bench server reads, and the client context that trusts them.

Every bench script that starts an ``EnforcerServer`` (or the floor server beside it) on 127.0.0.1
needs the same thing: a throwaway CA, a serving certificate it signs, the files in a cert dir, and a
client that verifies the server against that CA. The certificates come from
``holdwarden.certs.generate`` and the files are written by ``holdwarden.certs.bundle``, as the
shipped code makes and writes them.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

from holdwarden.certs.bundle import CA_BUNDLE, CERT_MODE, atomic_write, write_serving
from holdwarden.certs.generate import generate_ca, generate_serving

SERVICE = "holdwarden"


def write_serving_tls(
    directory: Path,
    *,
    namespace: str = "bench",
    ip_addresses: Sequence[str] = ("127.0.0.1",),
) -> ssl.SSLContext:
    """Make a new CA and a serving certificate it signs, write them into ``directory``.

    On return (``directory`` is created if missing):

    - ``directory`` holds ``tls.crt`` and ``tls.key`` (the serving certificate and its key,
      as ``holdwarden.certs.reload.ReloadingTLS`` reads them) and ``ca.crt`` (the CA certificate
      alone); each is written whole (``holdwarden.certs.bundle.atomic_write``), the key mode 0600.
      The CA key is not written: nothing signs again.
    - The serving certificate names Service ``holdwarden`` in ``namespace`` and each of
      ``ip_addresses``, so a client may connect to ``127.0.0.1`` with
      ``server_hostname="127.0.0.1"``.
    - The returned context is a default client context (host name checked, certificate
      required) that trusts that CA and no other: the context
      ``ssl.create_default_context(cafile=directory / "ca.crt")`` makes.

    Each call makes a new CA, so a context from an earlier call does not trust the new files.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = generate_ca()
    leaf = generate_serving(ca, SERVICE, namespace, ip_addresses=ip_addresses)
    atomic_write(directory / CA_BUNDLE, ca.cert_pem, CERT_MODE)
    write_serving(directory, leaf)
    return ssl.create_default_context(cafile=str(directory / CA_BUNDLE))
