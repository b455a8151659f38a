"""The reboot and GPU reset Jobs run the worker's own image (template image ``@worker``,
the config's ``jobs.worker_image``): the shipped configs name the image the Deployment runs, so an
install that sets its image in one place does not reboot from another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import chart, pins
from tests.deploy.conftest import OVERLAYS
from tests.deploy.kustomize import find
from worker.config import ConfigError, Settings, load_settings

CONFIG = "gpu-remediate-config"


def _settings(objects: list[dict[str, Any]], tmp_path: Path) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(find(objects, "ConfigMap", CONFIG)["data"]["config.yaml"])
    return load_settings(path)


def _worker_container_image(objects: list[dict[str, Any]]) -> str:
    deployment = find(objects, "Deployment", "gpu-remediate")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "worker"]
    return str(container["image"])


def _reboot_image(settings: Settings) -> str:
    image = settings.jobs.resolve("reboot", "").image
    # The GPU reset runs the same image (its script needs a shell and chroot only).
    assert settings.jobs.resolve("gpu-reset", "").image == image
    return image


@pytest.mark.parametrize("mode", OVERLAYS)
def test_each_shipped_overlay_refuses_to_start_until_its_images_are_pinned(
        mode: str, shipped: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """jobs.require_digest is on in the shipped configs: kustomize cannot reach into the
    config file, so the worker refuses to start (one error naming both fields and how to
    pin each) until the site names the worker's image and the validation image by digest."""
    with pytest.raises(ConfigError) as refused:
        _settings(shipped[mode], tmp_path)
    said = str(refused.value)
    deployment_image = _worker_container_image(shipped[mode])
    assert f"jobs: Value error, worker_image: '{deployment_image}' is not pinned" in said
    assert f"crane digest {deployment_image}" in said
    validation = Settings().jobs.templates["validation"].image
    assert f"templates.validation.image: '{validation}' is not pinned" in said
    assert f"crane digest {validation}" in said


@pytest.mark.parametrize("mode", OVERLAYS)
def test_each_overlay_reboots_from_the_image_its_deployment_runs(
        mode: str, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    settings = _settings(rendered[mode], tmp_path)
    assert _reboot_image(settings) == _worker_container_image(rendered[mode])
    # Not the built-in default, which names an image no registry serves for this install.
    assert _reboot_image(settings) != Settings().jobs.worker_image


def test_the_chart_reboots_from_its_image(helm: Path, tmp_path: Path) -> None:
    objects = chart.template(helm, {"image": {"repository": "registry.example.com/gpu-remediate",
                                              "tag": "1.2.3"}})
    image = f"registry.example.com/gpu-remediate:1.2.3@{pins.TEST_DIGEST}"
    assert _worker_container_image(objects) == image
    settings = _settings(objects, tmp_path)
    assert settings.jobs.worker_image == image
    assert _reboot_image(settings) == image


def test_the_chart_keeps_a_worker_image_the_config_names(helm: Path, tmp_path: Path) -> None:
    """The same image by digest, for require_digest, while the Deployment names a tag."""
    pinned = "registry.example.com/gpu-remediate@sha256:" + "a" * 64
    objects = chart.template(helm, {
        "image": {"repository": "registry.example.com/gpu-remediate", "tag": "1.2.3"},
        "config": {"jobs": {"worker_image": pinned}}})
    config = yaml.safe_load(find(objects, "ConfigMap", CONFIG)["data"]["config.yaml"])
    assert config["jobs"]["worker_image"] == pinned
    assert _reboot_image(_settings(objects, tmp_path)) == pinned
