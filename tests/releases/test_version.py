"""The vLLM version a service deploys: from the spec, the image tag, or the default."""

from __future__ import annotations

import pytest

from vllm_operator.releases.version import Version, deployed_version, image_tag, version_of_image

DEFAULT = Version(0, 32, 0)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.11.0", Version(0, 11, 0)),
        ("vllm/vllm-openai:0.19.1", Version(0, 19, 1)),
        ("vllm/vllm-openai:v0.10.1.1", Version(0, 10, 1)),
        ("registry.local:5000/team/vllm:v0.20.0-cu128", Version(0, 20, 0)),
        ("vllm/vllm-openai:v0.12.0rc1", Version(0, 12, 0)),
        ("vllm/vllm-openai:v0.15", Version(0, 15, 0)),
        ("vllm/vllm-openai:v0.11.0@sha256:" + "a" * 64, Version(0, 11, 0)),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:nightly-2026-11-30", None),
        ("vllm/vllm-openai@sha256:" + "b" * 64, None),
        ("registry.local:5000/vllm", None),
        ("vllm/vllm-openai:1234", None),
    ],
)
def test_the_version_an_image_tag_names(image: str, version: Version | None) -> None:
    assert version_of_image(image) == version


def test_a_registry_port_is_not_a_tag() -> None:
    assert image_tag("registry.local:5000/team/vllm") is None
    assert image_tag("registry.local:5000/team/vllm:v1") == "v1"


def test_the_spec_wins_then_the_tag_then_the_default() -> None:
    default_image = "vllm/vllm-openai:v0.32.0"
    spec = deployed_version(
        explicit="0.11.2", image="vllm/vllm-openai:v0.19.0", default_image=default_image,
        default=DEFAULT,
    )  # fmt: skip
    assert (spec.version, spec.source, spec.note) == (Version(0, 11, 2), "Spec", None)
    tagged = deployed_version(
        explicit=None, image="vllm/vllm-openai:v0.19.0", default_image=default_image,
        default=DEFAULT,
    )  # fmt: skip
    assert (tagged.version, tagged.source) == (Version(0, 19, 0), "ImageTag")
    unset = deployed_version(
        explicit=None, image=None, default_image=default_image, default=DEFAULT
    )
    assert (unset.version, unset.source) == (Version(0, 32, 0), "ImageTag")
    guess = deployed_version(
        explicit=None, image="mirror/vllm:latest", default_image=default_image, default=DEFAULT
    )
    assert (guess.version, guess.source) == (DEFAULT, "Default")
    assert guess.note is not None and "mirror/vllm:latest" in guess.note
    assert "spec.vllmVersion" in guess.note


def test_versions_order_and_print_as_releases() -> None:
    assert Version(0, 9, 2) < Version(0, 10, 0) < Version(0, 10, 1) < Version(1, 0, 0)
    assert str(Version.parse("v0.18")) == "0.18.0"
    assert Version.parse("0.18.x") is None
    assert Version(0, 18, 3).minor_release == Version(0, 18, 0)
