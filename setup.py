"""Package list for setuptools: every gpuctl package, plus themes/ shipped as gpuctl.themes."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["gpuctl", "gpuctl.*"]), "gpuctl.themes"],
    package_dir={"gpuctl.themes": "themes"},
)
