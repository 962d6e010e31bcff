"""Ship the loader files at the root of site-packages, for wheel, editable and sdist builds.

setuptools has no declarative way to put a file beside the packages (``data_files`` is relative to
``sys.prefix``), so ``build_py`` copies ``ascend_graph_patch.pth`` and its PEP 829 ``.start`` twin:

- regular wheel: into ``build_lib``, whose contents become the wheel's purelib root;
- editable wheel (PEP 660): setuptools ignores ``build_lib`` there (the packages are served from
  the source tree by a finder), so the files go into the unpacked wheel directory instead, which
  it exposes as ``install.install_lib``;
- sdist: ``loader/`` is added to the file list so a wheel built from the sdist has them too.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

LOADER_DIR = "loader"
LOADER_FILES = ("ascend_graph_patch.pth", "ascend_graph_patch.start")


class BuildPyWithLoader(build_py):
    def run(self) -> None:
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        for name in LOADER_FILES:
            self.copy_file(os.path.join(LOADER_DIR, name), os.path.join(target, name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if getattr(self, "editable_mode", False):
            return outputs  # not in build_lib: nothing for the editable link tree to map
        return outputs + [os.path.join(self.build_lib, n) for n in LOADER_FILES]


class SdistWithLoader(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        # The manifest comes from egg_info (no MANIFEST.in here): add the loader at copy time.
        loader = [os.path.join(LOADER_DIR, n) for n in LOADER_FILES]
        super().make_release_tree(base_dir, [*files, *(f for f in loader if f not in files)])


setup(cmdclass={"build_py": BuildPyWithLoader, "sdist": SdistWithLoader})
