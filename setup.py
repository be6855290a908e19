"""Package list for setuptools: every gpuctl package, plus themes/ shipped as gpuctl.themes.

``build_py`` starts from an empty build folder: setuptools copies modules into ``build/lib`` and
never removes one, so a module deleted from the checkout would stay in every later wheel (an
upgrade by ``scripts/install.sh``, ``pipx install .`` or ``uv tool install .`` kept it).
"""

import shutil
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


class FreshBuildPy(build_py):
    def run(self) -> None:
        lib = Path(self.build_lib)
        # only a build folder of this tree's own (an editable install builds elsewhere)
        if lib.is_dir() and Path.cwd() in lib.resolve().parents:
            shutil.rmtree(lib / "gpuctl", ignore_errors=True)
        super().run()


setup(
    packages=[
        *find_namespace_packages(include=["gpuctl", "gpuctl.*"], exclude=["*.__pycache__"]),
        "gpuctl.themes",
    ],
    package_dir={"gpuctl.themes": "themes"},
    cmdclass={"build_py": FreshBuildPy},
)
