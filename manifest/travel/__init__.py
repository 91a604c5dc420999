"""A run that travels: pack, sign, trust policy, attest, OMS weight signatures.

Every module here is imported lazily by the verbs that need it: ``pack`` needs
only the standard library and ``blake3``; ``sign``, ``attest`` and ``oms`` load
``cryptography``, ``sigstore``, ``in_toto_attestation`` and ``model_signing``
(the ``sign`` extra) on first use.
"""
