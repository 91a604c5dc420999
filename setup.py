"""Ships ``torch_manifest.pth`` at the top of site-packages (build_py), for wheels and
editable installs alike; every other setting lives in pyproject.toml.

The .pth line is the launcher's start-up hook (``docs/launcher.md``): it acts only in a
process whose environment carries ``MANIFEST_LAUNCH``, so it survives a command that
replaces ``PYTHONPATH``. setuptools' ``data-files`` install under the environment's
prefix, never into site-packages, hence a build step; an editable install
(``pip install -e``) builds its wheel from another directory, named below.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("manifest", "launch", "torch_manifest.pth")


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(PTH), str(Path(self._pth_dir(), PTH.name)), preserve_mode=False)

    def _pth_dir(self) -> str:
        # An editable wheel is assembled from the install command's directory, not from
        # build_lib (setuptools >= 64 drops build_lib's files there, PEP 660 editable_wheel).
        if getattr(self, "editable_mode", False):
            return str(self.get_finalized_command("install").install_lib)
        return str(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self._pth_dir(), PTH.name))]


setup(cmdclass={"build_py": BuildPyWithPth})
