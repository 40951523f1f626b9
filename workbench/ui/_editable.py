"""Build hook: editable installs get the data files too (the Netron server extension's config).

setuptools' ``editable_wheel`` means to install data files "as non editable", but asks the
distribution for ``has_data``, which does not exist (the method is ``has_data_files``), so
``pip install -e .`` skipped ``etc/jupyter/jupyter_server_config.d/workbench.json`` and
JupyterLab never loaded ``workbench.ui.netron_server``. Loaded by setuptools from
``[tool.setuptools.cmdclass]`` at build time: imports nothing of the workbench.
"""

from __future__ import annotations

from setuptools.command.editable_wheel import editable_wheel


class EditableWheel(editable_wheel):
    """``editable_wheel`` that also runs ``install_data`` into the wheel's ``.data`` folder."""

    def _run_install(self, category: str) -> None:
        if category == "data" and not hasattr(self.distribution, "has_data"):
            if self.distribution.has_data_files():
                self.run_command("install_data")
            return
        super()._run_install(category)
