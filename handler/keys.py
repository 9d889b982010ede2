"""The keys that cannot guard the service: empty, short, or known to anyone (standard library only: `sandlot
serve` checks them before its settings model loads, handler/early_settings.py, and the model the same way)."""

from __future__ import annotations

MIN_KEY_LENGTH = 16
# Keys anyone can know: the placeholders this repository ships (Kubernetes manifests, conf/config.yaml.example,
# infra/events/) and Dify's default (its docker-compose and .env.example set SANDBOX_API_KEY=dify-sandbox).
KNOWN_KEYS = frozenset({"dify-sandbox", "replace-me-with-a-long-random-key", "change-me", "replace-with-your-api-key"})


def weak_key_reason(name: str, key: str) -> str | None:
    """Why `key` cannot guard the service (empty, short, or one anyone knows), or None. The key itself is named
    only where it is public already."""
    if not key:
        return f"{name} is empty"
    if key.strip().lower() == "dify-sandbox":
        return (
            f"{name} is 'dify-sandbox', Dify's default key that anyone can look up (in Dify's docker/.env set "
            "SANDBOX_API_KEY, which its api and worker send too)"
        )
    if key.strip().lower() in KNOWN_KEYS:
        return f"{name} is {key.strip()!r}, a placeholder or default key that anyone can look up"
    if len(key) < MIN_KEY_LENGTH:
        return f"{name} is {len(key)} characters long, shorter than {MIN_KEY_LENGTH}"
    return None


def key_problems(api_key: str | None, admin_key: str) -> list[str]:
    """Why the keys set cannot guard the service: API_KEY (None: unset, which `sandlot serve` replaces with a
    random one), and SANDLOT_ADMIN_KEY where set; empty where they can."""
    keys = {"API_KEY": api_key, "SANDLOT_ADMIN_KEY": admin_key}
    return [
        reason
        for name, key in keys.items()
        if key is not None and (name == "API_KEY" or key) and (reason := weak_key_reason(name, key))
    ]
