"""Package layout only (the metadata is in pyproject.toml): the rooms collectors/, attribution/,
controller/ and rules/ stay at the repository's top level and install as faultlens.collectors,
faultlens.attribution, faultlens.controller and faultlens.rules (package data: every rules/*.yaml);
nothing else is installed at top level. The subpackages are found here so that a new directory under
a room needs no edit."""

from setuptools import find_namespace_packages, setup

ROOMS = ("collectors", "attribution", "controller")

packages = ["faultlens", "faultlens.rules"]
package_dir = {"faultlens": "faultlens", "faultlens.rules": "rules"}
for room in ROOMS:
    packages.append(f"faultlens.{room}")
    package_dir[f"faultlens.{room}"] = room
    # namespace: also directories without __init__.py (controller/lab/site: the campaign's
    # sitecustomize, controller/lab/jobs: its training scripts)
    packages += [
        f"faultlens.{room}.{sub}"
        for sub in find_namespace_packages(room, exclude=["*__pycache__*"])
    ]

setup(packages=packages, package_dir=package_dir)
