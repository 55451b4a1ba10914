"""The vLLM version a service deploys: stated in the spec, read from the serving image's
tag, or the operator's default, in that order. An image whose tag names no version
(``latest``, ``nightly``, a digest, a private build) is planned for the default version,
and the status says so."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from vllm_operator.constants import TESTED_VLLM_VERSION

_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?")
# A version at the start of a tag: v0.11.0, 0.11.0, v0.11.0-cu128, 0.11.0rc1, v0.9.0.1.
_TAG_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?=$|[-+_.a-z])")


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> Version | None:
        """``0.11.0``, ``v0.11``, ``0.9.0.1`` (a fourth part is dropped); None otherwise."""
        match = _VERSION.fullmatch(text.strip())
        if match is None:
            return None
        major, minor, patch, _ = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    @property
    def minor_release(self) -> Version:
        return Version(self.major, self.minor, 0)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def image_tag(image: str) -> str | None:
    """The tag of an image reference (``repo/name:tag@digest``), or None when it has none."""
    ref = image.split("@", 1)[0]
    _, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:  # a registry port (host:5000/name), not a tag
        return None
    return tag


def version_of_image(image: str) -> Version | None:
    """The vLLM version an image's tag names (vllm/vllm-openai:v0.11.0), if any."""
    tag = image_tag(image)
    if tag is None:
        return None
    match = _TAG_VERSION.match(tag)
    if match is None:
        return None
    major, minor, patch, _ = match.groups()
    return Version(int(major), int(minor), int(patch or 0))


VersionSource = Literal["Spec", "ImageTag", "Default"]


@dataclass(frozen=True)
class DeployedVersion:
    """The version planned for, where it came from, and a note when it is a guess."""

    version: Version
    source: VersionSource
    note: str | None = None


def deployed_version(
    *, explicit: str | None, image: str | None, default_image: str, default: Version
) -> DeployedVersion:
    """The version of vLLM a service runs: ``spec.vllmVersion``, else the tag of
    ``spec.image`` (or of the operator's default image), else ``default``."""
    if explicit is not None:
        stated = Version.parse(explicit)
        if stated is not None:
            return DeployedVersion(stated, "Spec")
    shown = image or default_image
    tagged = version_of_image(shown)
    if tagged is not None:
        return DeployedVersion(tagged, "ImageTag")
    return DeployedVersion(
        default,
        "Default",
        f"The tag of image {shown} names no vLLM version; planned for vLLM {default}, the "
        "operator's default. Set spec.vllmVersion to plan for the version the image runs.",
    )


_tested = Version.parse(TESTED_VLLM_VERSION)
assert _tested is not None
# The release the tests run: the version planned for when nothing says another.
TESTED_VERSION: Final[Version] = _tested
