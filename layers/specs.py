"""What an operator may ask to install: a package name with a version constraint, nothing else.

A requested package ends up as a line of a pip requirements file or an entry
of a package.json that a build runs as an unprivileged user; still, a URL, a
path, a VCS link or an option (`--index-url`, `--extra-index-url`, `-e`) would
make the build fetch code from wherever the spec says, or change where every
other package comes from. So by default a spec is only:

- Python: a PEP 508 requirement without URL or environment marker, parsed with
  `packaging` (pip's own parser): `six`, `six==1.16.0`, `requests[socks]>=2.31,<3`.
- Node.js: an npm package name, optionally `@` and a semver range as npm reads
  it (`is-number`, `is-number@^7.0.0`, `@scope/pkg@~1.2`): the name by the rules
  of npm's validate-npm-package-name for new packages (below), the range checked
  with node-semver (a Python port of npm's own `semver`); tags, aliases
  (`npm:`), URLs, git and `file:` specs are refused.

SANDLOT_PACKAGES_ALLOW_ANY_SPEC=true lets anything through that fits on one line
(the name of an npm entry must still be a valid name: it is a package.json key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtimes.languages import by_wire_name, is_known

MAX_SPEC = 300  # characters: a name (214 at most on npm) and a constraint
MAX_NPM_NAME = 214  # validate-npm-package-name

# validate-npm-package-name, rules for new packages: lowercase; only what encodeURIComponent leaves alone; in the
# package part none of ~'!()*; no leading dot or underscore; not node_modules or favicon.ico. A scope is
# `@` + the same URL-safe lowercase characters.
_NPM_NAME = re.compile(r"^(?:@(?P<scope>[a-z0-9\-._~!'()*]+)/)?(?P<package>[a-z0-9\-._]+)$")
_NPM_RESERVED = {"node_modules", "favicon.ico"}


class SpecError(ValueError):
    """A spec that is refused; the message says what is wrong with it."""


class PackageRefused(Exception):
    """A change that cannot be made: `status` is the HTTP status that says why (404 unknown, 409 from the base)."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PackageSpec:
    """A requested package: its name (the key it is known by), the spec as given, and what goes into the build
    (a requirements line for pip, the range or spec for package.json)."""

    name: str
    spec: str
    build: str

    def to_dict(self) -> dict:
        return {"name": self.name, "spec": self.spec, "build": self.build}

    @classmethod
    def from_dict(cls, data: dict) -> PackageSpec:
        return cls(str(data["name"]), str(data["spec"]), str(data["build"]))


def _one_line(spec: object, language: str) -> str:
    if not isinstance(spec, str):
        raise SpecError(f"a {language} package spec must be a string")
    text = spec.strip()
    if not text:
        raise SpecError("empty package spec")
    if len(text) > MAX_SPEC:
        raise SpecError(f"package spec longer than {MAX_SPEC} characters")
    if any(ch in text for ch in "\r\n\0") or not text.isprintable():
        raise SpecError("a package spec must be one line of printable characters")
    return text


def python_name(name: str) -> str:
    """The name pip matches on (PEP 503): `Jinja2`, `jinja_2` and `jinja-2` are one package."""
    from packaging.utils import canonicalize_name  # (the parsers load where a spec is read: not at every start)

    return canonicalize_name(name)


def syntax(language: str) -> str:
    """The syntax of a language's packages, "pip" or "npm" (its record's, runtimes/languages.py); "" for none."""
    return by_wire_name(language).packages if is_known(language) else ""


def parse_python(text: str, allow_any: bool = False) -> PackageSpec:
    """A pip requirement (one line: _one_line's), or SpecError saying why not."""
    from packaging.requirements import InvalidRequirement, Requirement

    if allow_any:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:  # an option, a path, a bare URL: known by its text
            return PackageSpec(text, text, text)
        return PackageSpec(python_name(requirement.name), text, text)
    if text.startswith("-"):
        raise SpecError(f"{text!r}: pip options are not accepted, only a package name and a version constraint")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        looks_like = "a path or URL" if "/" in text or ":" in text else "a package name and a version constraint"
        reason = str(exc).splitlines()[0] if str(exc) else "unparsable"
        raise SpecError(f"{text!r} is not a valid requirement ({looks_like}?): {reason}") from None
    if requirement.url:
        raise SpecError(f"{text!r}: URLs, paths and VCS links are not accepted, only a name and a version constraint")
    if requirement.marker is not None:
        raise SpecError(f"{text!r}: environment markers are not accepted (the layer serves one interpreter)")
    return PackageSpec(python_name(requirement.name), str(requirement), str(requirement))


def check_npm_name(name: str) -> str:
    """name, or SpecError naming the npm rule it breaks."""
    if not name:
        raise SpecError("empty npm package name")
    if len(name) > MAX_NPM_NAME:
        raise SpecError(f"npm package name longer than {MAX_NPM_NAME} characters")
    if name != name.lower():
        raise SpecError(f"{name!r}: npm package names are lowercase")
    match = _NPM_NAME.match(name)
    if match is None:
        raise SpecError(
            f"{name!r} is not an npm package name (lowercase letters, digits, `-`, `.`, `_`, optionally `@scope/`)"
        )
    package = match.group("package")
    if package[0] in "._":
        raise SpecError(f"{name!r}: an npm package name cannot start with `.` or `_`")
    if name in _NPM_RESERVED:
        raise SpecError(f"{name!r} is not an allowed npm package name")
    return name


def _split_npm(text: str) -> tuple[str, str | None]:
    """`name@range` -> (name, range); the `@` of a scope is not a separator."""
    at = text.find("@", 1)
    if at == -1:
        return text, None
    return text[:at], text[at + 1 :]


def parse_npm(text: str, allow_any: bool = False) -> PackageSpec:
    """An npm name with an optional semver range (one line: _one_line's), or SpecError saying why not."""
    name, version = _split_npm(text)
    if not allow_any and (":" in name or name.startswith((".", "/", "~")) or name.endswith((".tgz", ".tar.gz"))):
        raise SpecError(f"{text!r}: URLs, paths, git and file specs are not accepted, only a name and a semver range")
    check_npm_name(name)
    if version is None:
        return PackageSpec(name, name, "*")
    version = version.strip()
    if allow_any:
        if not version:
            raise SpecError(f"{text!r}: nothing after `@`")
        return PackageSpec(name, text, version)
    if not version:
        raise SpecError(f"{text!r}: nothing after `@` (give a semver range, e.g. {name}@^1.0.0)")
    import nodesemver

    try:
        valid = nodesemver.valid_range(version, False)
    except Exception:  # noqa: BLE001 - the port raises on some malformed input instead of answering None
        valid = None
    if valid is None:
        raise SpecError(
            f"{text!r}: {version!r} is not a semver range (tags, aliases, URLs, git and file specs are not accepted)"
        )
    return PackageSpec(name, f"{name}@{version}", version)


def parse(language: str, spec: object, allow_any: bool = False) -> PackageSpec:
    parser = {"pip": parse_python, "npm": parse_npm}.get(syntax(language))
    if parser is None:
        raise SpecError("unsupported language")
    return parser(_one_line(spec, language), allow_any)


def name_key(language: str):
    """The function giving the key a package of the language is known by: pip's canonical name, or the name."""
    return python_name if syntax(language) == "pip" else str


def normalize_name(language: str, name: object) -> str:
    """The key a package is known by, for a remove: pip's canonical name, or the npm name as it is."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError("a package name must be a non-empty string")
    name = name.strip()
    if syntax(language) == "pip":
        return python_name(name) if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) else name
    return name
