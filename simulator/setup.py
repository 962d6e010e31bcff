"""Ship ``torch_npu_sim.pth`` at the root of site-packages (wheel, editable and sdist builds).

The same mechanism as ascend-graph-patch's own setup.py, kept separate on purpose: each
distribution's sdist must build on its own. See that file for why ``build_py`` is the hook.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

LOADER = os.path.join("loader", "torch_npu_sim.pth")


class BuildPyWithLoader(build_py):
    def run(self) -> None:
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        self.copy_file(LOADER, os.path.join(target, os.path.basename(LOADER)))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, os.path.join(self.build_lib, os.path.basename(LOADER))]


class SdistWithLoader(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, [*files, *([LOADER] if LOADER not in files else [])])


setup(cmdclass={"build_py": BuildPyWithLoader, "sdist": SdistWithLoader})
