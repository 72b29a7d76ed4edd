"""Credentials never reach a run file or W&B: `scrub_secrets` on every config written."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

# Singular `token` only, so that `tokens_per_second`, `max_tokens` or `tokenizer` survive.
_SECRET_KEY = re.compile(r"api_?key|secret|passw(?:or)?d|credential|token(?![a-z])", re.IGNORECASE)
_SECRET_ENV_NAME = re.compile(
    r"API_?KEY|(?:^|_)KEY$|(?:^|_)TOKEN(?:_|$)|SECRET|PASSW(?:OR)?D|CREDENTIAL", re.IGNORECASE
)
_MIN_SECRET_LENGTH = 8  # shorter values ("true", "1") would redact innocent strings


def _secret_env_values() -> list[str]:
    return [
        value
        for name, value in os.environ.items()
        if _SECRET_ENV_NAME.search(name) and len(value) >= _MIN_SECRET_LENGTH
    ]


def scrub_secrets(config: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `config` with credentials removed, safe to write to disk and to W&B.

    Keys naming a credential (api_key, apikey, secret, password, passwd, credential, or the
    word `token` -- `tokens_per_second` and `tokenizer` are kept) are dropped; strings that
    contain the value (>= 8 characters) of a credential-like environment variable
    (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...) become "<redacted>". Accepts
    `ml_collections.ConfigDict` too (anything with `to_dict()`).
    """
    secrets = _secret_env_values()

    def scrub(value: Any) -> Any:
        if hasattr(value, "to_dict") and not isinstance(value, Mapping):
            value = value.to_dict()
        if isinstance(value, Mapping):
            return {k: scrub(v) for k, v in value.items() if not _SECRET_KEY.search(str(k))}
        if isinstance(value, (list, tuple)):
            return type(value)(scrub(v) for v in value)
        if isinstance(value, str) and any(secret in value for secret in secrets):
            return REDACTED
        return copy.deepcopy(value)

    return scrub(config)
